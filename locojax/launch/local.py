"""Runs N emulated hosts on one machine: N copies of a command joined by `jax.distributed`.

Each copy gets JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID (what a user's own
launcher would set; read by `locojax.launch.join` and `init_distributed`), its own CPU device
count and JAX_PLATFORMS=cpu. `mesh=cpu mesh.hosts=N` starts N copies of the user's own
`python -m locojax ...` command this way. Output: host 0's
stdout and stderr come out unprefixed; other hosts' stderr lines come out on the
launcher's stderr prefixed `[host i] `, and their stdout is dropped (logs stay short; the
coordinator is the one that reports) unless `all_stdout=True`, which prefixes it too.
Every host's output goes through the launcher line by line, so lines of different hosts
never interleave mid-line.

Failure: when a host exits non-zero or dies by a signal, the survivors abort by themselves
once the distributed heartbeat notices; after `grace_s` the launcher terminates the rest.
From the first failure on only the failed host's lines come through (the survivors' lost-
peer tracebacks are noise), and one line names the host that failed first, unless it
exited 2 after its own `error:` line (a user error, already said; every host says it, and
a line another host printed is not repeated). SIGINT, SIGTERM or SIGHUP to the launcher sends
the same signal to every host and waits `stop_grace_s` for them to save and exit (the run saves its
current step), then kills what is left (a second signal: at once); only host 0's `stopped
by ...` line comes through, or the launcher's own. Each host runs in its own process group,
and the whole group is killed, so nothing is left behind.

CLI: python -m locojax.launch.local --hosts 2 --devices-per-host 4 -- python -m ...
"""

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO

from locojax.runtime.process.job import coordinator_env, free_port, with_device_count
from locojax.runtime.process.stop import SIGNALS as STOP_SIGNALS

_POLL_S = 0.05
_TERM_WAIT_S = 3.0


class _Stopped(Exception):
    """Raised in the launcher when it receives SIGINT or SIGTERM."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def host_env(base: dict[str, str], port: int, num_hosts: int, host: int,
             devices_per_host: int, heartbeat_timeout_s: int) -> dict[str, str]:
    """The environment of emulated host `host`."""
    env = dict(base)
    env.update(
        **coordinator_env(port, num_hosts, host),
        LOCOJAX_HEARTBEAT_TIMEOUT_S=str(heartbeat_timeout_s),
        XLA_FLAGS=with_device_count(base.get("XLA_FLAGS", ""), devices_per_host),
        JAX_PLATFORMS="cpu",
    )
    return env


def describe_exit(returncode: int) -> str:
    """`exit code 3` or `killed by signal 9 (SIGKILL)` for a Popen return code."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = f" ({signal.Signals(-returncode).name})"
    except ValueError:
        name = ""
    return f"killed by signal {-returncode}{name}"


class _Output:
    """Which hosts' lines still come through; `error:` lines already printed are dropped."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.speaker: int | None = None
        """After the first failure: the only host whose lines come through."""
        self.stopping = False
        self.seen: set[str] = set()
        self.reported = False
        """A host printed its own `error:` or `stopped by` line."""

    def write(self, host: int, prefix: str, line: str, dst: IO[str]) -> None:
        with self.lock:
            if self.stopping and not (host == 0 and line.startswith("stopped by ")):
                return
            if self.speaker is not None and host != self.speaker:
                return
            if line.startswith("error: "):
                if line in self.seen:
                    return
                self.seen.add(line)
            self.reported |= line.startswith(("error: ", "stopped by "))
            dst.write(prefix + line)
            dst.flush()


def _pump(src: IO[bytes], dst: IO[str], prefix: str, host: int, out: _Output) -> None:
    """Copies whole lines from a child's pipe to `dst` with a prefix; a killed child's last,
    unfinished line is ended, so the launcher's own line starts on a line of its own."""
    for raw in iter(src.readline, b""):
        line = raw.decode(errors="replace")
        out.write(host, prefix, line if line.endswith("\n") else line + "\n", dst)
    src.close()


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    """Sends `sig` to the child's whole process group (it leads its own session)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_all(procs: list[subprocess.Popen], wait_s: float = _TERM_WAIT_S,
              now: threading.Event | None = None, sig: int = signal.SIGTERM) -> None:
    """`sig` to every live host's group, then SIGKILL whatever is left after `wait_s` (or as
    soon as `now` is set: a second signal to the launcher)."""
    for p in procs:
        if p.poll() is None:
            _kill_group(p, sig)
    deadline = time.monotonic() + wait_s
    while None in [p.poll() for p in procs] and time.monotonic() < deadline \
            and not (now is not None and now.is_set()):
        time.sleep(_POLL_S)
    for p in procs:  # also reaps grandchildren a host left in its group
        _kill_group(p, signal.SIGKILL)
        p.wait()


def _raise_stopped(signum: int, _frame) -> None:
    raise _Stopped(signum)


def _watch(procs: list[subprocess.Popen], grace_s: float,
           out: _Output) -> tuple[int, int] | None:
    """Waits for all hosts; returns (host, returncode) of the first failure, or None."""
    first: tuple[int, int] | None = None
    deadline = float("inf")
    while None in [p.poll() for p in procs]:  # a list, not any(): poll every host each pass
        if first is None:
            failed = [(i, p.returncode) for i, p in enumerate(procs)
                      if p.returncode not in (None, 0)]
            if failed:
                first = failed[0]
                with out.lock:
                    out.speaker = first[0]
                deadline = time.monotonic() + grace_s
        if time.monotonic() > deadline:
            break
        time.sleep(_POLL_S)
    if first is None:
        failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
        first = failed[0] if failed else None
    return first


def _start_host(command: list[str], env: dict[str, str], host: int, keep_stdout: bool,
                out: _Output, pumps: list[threading.Thread]) -> subprocess.Popen:
    """Host `host`'s process (its own process group: killpg reaches all it spawns), its
    output pumped to ours (prefixed `[host i] ` but host 0's)."""
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE if keep_stdout else subprocess.DEVNULL,
                            start_new_session=True)
    prefix = "" if host == 0 else f"[host {host}] "
    for src, dst in ((proc.stderr, sys.stderr), (proc.stdout, sys.stdout)):
        if src is not None:
            t = threading.Thread(target=_pump, args=(src, dst, prefix, host, out), daemon=True)
            t.start()
            pumps.append(t)
    return proc


def _stopped(signum: int, procs: list[subprocess.Popen], pumps: list[threading.Thread],
             old: dict, out: _Output, stop_grace_s: float) -> int:
    """The launcher got SIGINT / SIGTERM / SIGHUP: pass it to the hosts, give them `stop_grace_s` to
    save and exit (a second signal kills them at once); 128 + the signal."""
    now = threading.Event()
    for s in old:  # a second signal kills the hosts at once, without their save
        signal.signal(s, lambda *_: now.set())
    with out.lock:
        out.stopping = True
    _stop_all(procs, stop_grace_s, now, sig=signum)  # Ctrl-C stays SIGINT
    for t in pumps:
        t.join(timeout=1.0)
    if not out.reported:
        print(f"launcher: stopped {len(procs)} hosts on {signal.Signals(signum).name}",
              file=sys.stderr, flush=True)
    return 128 + signum


def launch_local_hosts(
    num_hosts: int,
    devices_per_host: int,
    command: list[str],
    *,
    env: dict[str, str] | None = None,
    heartbeat_timeout_s: int = 10,
    grace_s: float = 15.0,
    stop_grace_s: float = _TERM_WAIT_S,
    all_stdout: bool = False,
    port: int | None = None,
) -> int:
    """Runs `command` as `num_hosts` local JAX processes; 0 if all exit 0, else non-zero.
    `stop_grace_s`: how long hosts get to save and exit after SIGINT/SIGTERM.
    `port`: the coordinator's port on 127.0.0.1 (None: a free one)."""
    if num_hosts < 1 or devices_per_host < 1:
        raise ValueError(f"num_hosts={num_hosts} and devices_per_host={devices_per_host} "
                         "must both be >= 1")
    base = {**os.environ, **(env or {})}
    port = port or free_port()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    out = _Output()
    in_main = threading.current_thread() is threading.main_thread()
    # the signals a run answers with a save are passed to every host (a closed terminal's
    # SIGHUP too: no host is left behind)
    old = {s: signal.getsignal(s) for s in STOP_SIGNALS} if in_main else {}
    try:
        for s in old:
            signal.signal(s, _raise_stopped)
        for host in range(num_hosts):
            env_h = host_env(base, port, num_hosts, host, devices_per_host, heartbeat_timeout_s)
            procs.append(_start_host(command, env_h, host, host == 0 or all_stdout, out, pumps))
        first = _watch(procs, grace_s, out)
    except _Stopped as stop:
        return _stopped(stop.signum, procs, pumps, old, out, stop_grace_s)
    finally:
        _stop_all(procs)
        for t in pumps:
            t.join(timeout=1.0)
        for s, handler in old.items():
            signal.signal(s, handler)
    if first is None:
        return 0
    host, code = first
    if not (code in (1, 2) and out.reported):  # a user error or a diverged run: said why
        print(f"launcher: host {host} died: {describe_exit(code)}", file=sys.stderr, flush=True)
    return code if code > 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    """CLI: launcher options, then `--`, then the command each host runs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--devices-per-host", type=int, required=True)
    parser.add_argument("--heartbeat-timeout-s", type=int, default=10)
    parser.add_argument("--grace-s", type=float, default=15.0)
    parser.add_argument("--stop-grace-s", type=float, default=_TERM_WAIT_S)
    parser.add_argument("--all-stdout", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    return launch_local_hosts(args.hosts, args.devices_per_host, command,
                              heartbeat_timeout_s=args.heartbeat_timeout_s,
                              grace_s=args.grace_s, stop_grace_s=args.stop_grace_s,
                              all_stdout=args.all_stdout)


if __name__ == "__main__":
    sys.exit(main())

"""jax.distributed's fatal reports as one line: a host that never joined, a host that died.

When the coordination service gives up (a host missing at the registration deadline, a peer
silent past the heartbeat timeout), XLA's C++ client logs the status over several lines and
aborts the process with a stack trace (exit 134); Python never sees an exception, and the
client's missed-heartbeat callback is not usable from Python (jaxlib 0.10.2: std::bad_cast).
So a joined process forks before `jax.distributed` starts (`supervise`): the child is the
host; the process the user started reads the host's stderr, passes every line through except
the coordination service's own log records and, when the fatal record comes, prints one line
instead, for example

    error: 1 of 2 hosts joined within controller.init_timeout_s=5 (missing: host 1); ...   exit 2
    error: host 1 stopped sending heartbeats for controller.heartbeat_timeout_s=10 ...     exit 1

drops the rest, and exits with the line's code instead of the abort's. Otherwise it exits as
the host did (signals are passed on; the host dies with its supervisor). Records of the
service that are not followed by a fatal one come out unchanged, at most `HOLD_S` late.
"""

from __future__ import annotations

import os
import re
import select
import signal
import sys
import time
from dataclasses import dataclass

from locojax.runtime.errors import hosts_named
from locojax.runtime.process.parent import die_with

HOLD_S = 2.0
"""How long a coordination-service record is held back, waiting for a fatal one."""
SETTLE_S = 1.0
"""Quiet time after the fatal record before the line is printed (its status comes after)."""
_GLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ (?P<file>[\w.+-]+):\d+\] ")
_SERVICE_FILES = re.compile(r"^(coordination_\w+|client|distributed\w*|preemption_\w+)\.(cc|h)$")
_FATAL = "Terminating process because the JAX distributed service detected fatal errors"


@dataclass(frozen=True)
class Context:
    """What the line names: this host and the timeouts it joined with."""

    process_id: int
    num_processes: int
    coordinator: str
    init_timeout_s: int
    heartbeat_timeout_s: int


def _task_ids(text: str, after: str) -> list[int]:
    """The task numbers XLA lists after `after` (one per line, or comma-separated)."""
    match = re.search(re.escape(after) + r"\s*(\d+(?:\s*[,\n]\s*\d+)*)", text)
    return sorted({int(x) for x in re.findall(r"\d+", match.group(1))}) if match else []


def fatal_line(text: str, ctx: Context) -> str:
    """The one line for the fatal report `text` (the record and what followed it)."""
    n, me = ctx.num_processes, ctx.process_id
    start = ("start the same command on every host (one task per host), or give them longer "
             "to start with controller.init_timeout_s")
    reached = re.search(r"# of tasks that reached the barrier: (\d+)/(\d+)", text)
    if reached and "Wait_for_all_tasks_to_register" in text:
        k, n = int(reached.group(1)), int(reached.group(2))
        missing = _task_ids(text, "Some timed out task names:")
        some = "" if len(missing) == n - k else "e.g. "
        named = f" (missing: {some}{hosts_named(missing)})" if missing else ""
        return (f"error: {k} of {n} hosts joined within controller.init_timeout_s="
                f"{ctx.init_timeout_s}{named}; {start}")
    if "RegisterTask" in text and "DEADLINE_EXCEEDED" in text:
        if me != 0:
            return (f"error: at most {n - 1} of {n} hosts joined: host 0, the coordinator at "
                    f"{ctx.coordinator}, did not answer within controller.init_timeout_s="
                    f"{ctx.init_timeout_s}; {start}")
        return (f"error: fewer than {n} of {n} hosts joined within controller.init_timeout_s="
                f"{ctx.init_timeout_s}; {start}")
    if "stopped sending heartbeats" in text:
        dead = _task_ids(text, "stopped sending heartbeats):")
        who = hosts_named(dead) if dead else "a host"
        return (f"error: {who} stopped sending heartbeats for controller.heartbeat_timeout_s="
                f"{ctx.heartbeat_timeout_s} (died, was killed or hangs): stopping host {me} too")
    status = text.split("absl::Status:", 1)[-1].strip().splitlines()
    return f"error: jax.distributed stopped host {me}: {status[0] if status else 'fatal error'}"


def exit_code(line: str) -> int:
    """The supervisor's exit code for a fatal line: 2 for a job that never formed (start every
    host, or give them longer: the door's code for what the user asked for), 1 for a run that
    broke (a peer died or hangs; anything else the service reports)."""
    return 2 if " hosts joined" in line else 1


class LineFilter:
    """Decides, line by line, what reaches the real stderr."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.code = 1
        """The exit code of the fatal line, once it was printed (`exit_code`)."""
        self.said = False
        self.held: list[str] = []
        self.held_since: float | None = None
        self.fatal: list[str] | None = None
        self.last = 0.0

    def feed(self, line: str, now: float) -> list[str]:
        """The lines to write now, given one more input line (with its newline)."""
        self.last = now
        if self.fatal is not None:
            self.fatal.append(line)
            return []
        match = _GLOG.match(line)
        if match and _FATAL in line:
            self.fatal = [line]
            self.held = []
            return []
        if match and _SERVICE_FILES.match(match.group("file")):
            self.held.append(line)
            self.held_since = now
            return []
        if self.held and not match:  # a continuation of the held record, or its neighbour
            self.held.append(line)
            return []
        return [*self.release(), line]

    def release(self) -> list[str]:
        """Held lines, in order, and nothing held afterwards."""
        out, self.held, self.held_since = self.held, [], None
        return out

    def tick(self, now: float) -> list[str]:
        """The lines due without new input: held records past `HOLD_S`, the settled line."""
        if self.fatal is not None:
            return [self.finish()] if now - self.last >= SETTLE_S and not self.said else []
        if self.held_since is not None and now - self.held_since >= HOLD_S:
            return self.release()
        return []

    def finish(self) -> str:
        """The one line, once: empty afterwards, also when more of the report (its stack
        trace, slow to come on a loaded machine) arrives after the line was printed."""
        if not self.fatal or self.said:
            return ""
        self.said = True
        line = fatal_line("".join(self.fatal), self.ctx)
        self.fatal, self.code = [], exit_code(line)
        return line + "\n"

    def close(self) -> list[str]:
        """At end of input: the one line if a fatal record came, else what is still held."""
        if self.fatal is not None:
            return [self.finish()]
        return self.release()


def supervise(ctx: Context) -> None:
    """From now on this process is the host's supervisor; the call returns in the host.

    Forks (before `jax.distributed` starts, so no JAX thread exists yet): the child is the
    host and returns from here with its stderr (fd 2, C++ writes included) on a pipe; this
    process (the pid the user, srun or the launcher started) reads that pipe through a
    `LineFilter`, passes signals on to the host, waits for it and exits with its code, or,
    when XLA aborted it after a fatal record, with the code of the one line (`exit_code`):
    the abort's own 134 and stack trace never reach the user. It never returns.
    """
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    # A signal sent right after the fork waits until the supervisor passes it on (the host
    # may signal its supervisor before `watch` has set the handlers).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _PASSED_ON)
    pid = os.fork()
    if pid == 0:  # the host
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(read_end)
        os.dup2(write_end, 2)
        os.close(write_end)
        die_with(parent)
        return
    os.close(write_end)
    code = watch(pid, read_end, LineFilter(ctx), mask)
    os._exit(code)


_PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _from_terminal(signum: int) -> bool:
    """True for a Ctrl-C (or Ctrl-\\) the terminal already sent to the host as well."""
    if signum != signal.SIGINT:
        return False
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def watch(pid: int, fd: int, filt: LineFilter, mask: set[signal.Signals]) -> int:
    """The supervisor's loop: `fd` (the host's stderr) -> fd 2 through `filt` until the host
    `pid` has exited and its stderr is drained; the exit code for this process. `mask`: the
    signal mask to restore once the handlers are set (signals held since the fork arrive)."""

    def pass_on(signum: int, _frame) -> None:
        if not _from_terminal(signum):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    for sig in _PASSED_ON:
        signal.signal(sig, pass_on)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    status: int | None = None
    drain_until = float("inf")
    pending = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 0.2)
        now = time.monotonic()
        chunk = os.read(fd, 1 << 16) if ready else None
        if chunk == b"" or now > drain_until:  # end of file, or a grandchild holds it open
            break
        if chunk:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                _write(filt.feed(raw.decode(errors="replace") + "\n", now))
        _write(filt.tick(now))
        if status is None:
            done, status_now = os.waitpid(pid, os.WNOHANG)
            if done:
                status, drain_until = status_now, now + 2.0
    if pending:
        _write(filt.feed(pending.decode(errors="replace"), time.monotonic()))
    saw_fatal = filt.fatal is not None
    _write(filt.close())
    os.close(fd)
    if status is None:
        _, status = os.waitpid(pid, 0)
    if saw_fatal:
        return filt.code
    if os.WIFSIGNALED(status):  # the same death for whoever waits on this process
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL and sig != signal.SIGSTOP:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.waitstatus_to_exitcode(status)


def _write(lines: list[str]) -> None:
    for line in lines:
        if line:
            os.write(2, line.encode(errors="replace"))



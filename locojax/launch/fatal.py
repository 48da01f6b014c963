"""jax.distributed's fatal reports as one line: a host that never joined, a host that died.

When the coordination service gives up (a host missing at the registration deadline, a peer
silent past the heartbeat timeout), XLA's C++ client logs the status over several lines and
aborts the process with a stack trace; Python never sees an exception. So a joined host routes
its stderr through a small reader process (`route_stderr`, before `jax.distributed` starts),
which passes every line through except the coordination service's own log records; when the
fatal record comes it prints one line instead, for example

    error: 1 of 2 hosts joined within controller.init_timeout_s=5 (missing: host 1); ...
    error: host 1 stopped sending heartbeats for controller.heartbeat_timeout_s=10 ...

and drops the rest (the reader outlives the aborted process: it stops at end of file).
Records of the service that are not followed by a fatal one come out unchanged, at most
`HOLD_S` late.

    python -m locojax.launch.fatal '<context JSON>'     (the reader; stdin is the host's stderr)
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass

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


def _hosts(ids: list[int]) -> str:
    return ("host " if len(ids) == 1 else "hosts ") + ", ".join(map(str, ids))


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
        named = f" (missing: {some}{_hosts(missing)})" if missing else ""
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
        who = _hosts(dead) if dead else "a host"
        return (f"error: {who} stopped sending heartbeats for controller.heartbeat_timeout_s="
                f"{ctx.heartbeat_timeout_s} (died, was killed or hangs): stopping host {me} too")
    status = text.split("absl::Status:", 1)[-1].strip().splitlines()
    return f"error: jax.distributed stopped host {me}: {status[0] if status else 'fatal error'}"


class LineFilter:
    """Decides, line by line, what reaches the real stderr."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
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
            return [self.finish()] if now - self.last >= SETTLE_S else []
        if self.held_since is not None and now - self.held_since >= HOLD_S:
            return self.release()
        return []

    def finish(self) -> str:
        """The one line, once (empty afterwards)."""
        if not self.fatal:
            return ""
        line = fatal_line("".join(self.fatal), self.ctx) + "\n"
        self.fatal = []
        return line

    def close(self) -> list[str]:
        """At end of input: the one line if a fatal record came, else what is still held."""
        if self.fatal is not None:
            return [self.finish()]
        return self.release()


def route_stderr(ctx: Context) -> None:
    """From now on this process's stderr (fd 2, C++ writes included) goes through the reader."""
    read_end, write_end = os.pipe()
    reader = subprocess.Popen(
        [sys.executable, "-m", "locojax.launch.fatal", json.dumps(asdict(ctx))],
        stdin=read_end, stdout=2, stderr=2, close_fds=True)
    os.close(read_end)
    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    route_stderr.reader = reader  # kept referenced; it ends at end of file, after this process


def _write(lines: list[str]) -> None:
    for line in lines:
        if line:
            os.write(1, line.encode(errors="replace"))


def main(argv: list[str]) -> int:
    """The reader: stdin -> stdout through a LineFilter, until end of file."""
    import time

    for sig in (signal.SIGINT, signal.SIGTERM):  # it stops at end of file, after its host
        signal.signal(sig, signal.SIG_IGN)
    filt = LineFilter(Context(**json.loads(argv[0])))
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.2)
        now = time.monotonic()
        if not ready:
            _write(filt.tick(now))
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            _write(filt.feed(raw.decode(errors="replace") + "\n", now))
        _write(filt.tick(now))
    if pending:
        _write(filt.feed(pending.decode(errors="replace"), time.monotonic()))
    _write(filt.close())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

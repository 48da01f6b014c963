"""The parent's side of one environment worker process (`env_worker`), each answer time-limited.

    EnvWorker.start() -> spawn, "ready", Load -> ("ok", schemas) | ("user", line) | ("died", why)
    EnvWorker.ask(request, limit) -> Answer; past the limit, or on EOF, the process is killed
    and `generation` goes up: the environments it held are gone. The next ask starts another.

The sibling of `locojax.rewards.worker.FnWorker` (the same plain subprocess over a socketpair,
the same "ready" handshake not counted against a limit), with a protocol of its own: requests
are the dataclasses of `messages`, and the worker keeps state (environments) between them.
Not thread-safe: the runner gives each worker one thread.
"""

from __future__ import annotations

import subprocess
import weakref
from multiprocessing.connection import Connection

from locojax.envs.messages import Load
from locojax.rewards.worker import Answer, kill, spawn


class EnvWorker:
    """One environment worker process, started on first use and after each kill."""

    def __init__(self, load: Load, startup_timeout_s: float = 120.0, memory_mb: int = 0) -> None:
        self.load = load
        """The user's code the worker imports before it takes requests."""
        self.startup_timeout_s = startup_timeout_s
        """Limit on the start: the interpreter, the imports and `Load`."""
        self.memory_mb = memory_mb
        """The process's address-space limit in MiB (0: none; `worker.spawn`)."""
        self.generation = 0
        """Processes stopped so far: an environment opened in generation g is gone once this
        is past g."""
        self._schemas: list[dict] = []
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._finalizer: weakref.finalize | None = None

    def start(self) -> Answer:
        """Start the process unless it runs; the `Load` answer (("ok", schemas) when it runs)."""
        if self._process is not None and self._process.poll() is None:
            return "ok", self._schemas
        self._stop()
        self._process, self._conn, self._finalizer = spawn("locojax.envs.env_worker", [],
                                                           self, self.memory_mb)
        status, value = self._wait("ready", self.startup_timeout_s)
        if status == "ok":
            self._conn.send(self.load)
            status, value = self._wait(None, self.startup_timeout_s)
        if status == "ok":
            self._schemas = value
        else:
            self._stop()
            if status == "timeout":
                status, value = "died", f"the worker did not start in {self.startup_timeout_s:g} s"
        return status, value

    def _wait(self, expected: str | None, timeout_s: float) -> Answer:
        """The next answer (or the `expected` word as ("ok", None)) within `timeout_s`."""
        assert self._conn is not None
        try:
            if not self._conn.poll(timeout_s):
                return "timeout", f"timed out after {timeout_s:g} s"
            got = self._conn.recv()
        except (EOFError, OSError):
            return "died", "its worker process died"
        if expected is not None:
            return ("ok", None) if got == expected else ("died", f"said {got!r} at its start")
        return got

    def ask(self, request: object, timeout_s: float) -> Answer:
        """The worker's answer to `request` within `timeout_s`; past it (or when the worker
        dies) the process is killed and the answer says so."""
        status, value = self.start()
        if status != "ok":
            return status, value
        assert self._conn is not None
        try:
            self._conn.send(request)
        except OSError:
            self._stop()
            return "died", "its worker process died"
        answer = self._wait(None, timeout_s)
        if answer[0] in ("timeout", "died"):
            self._stop()
        return answer

    def _stop(self) -> None:
        if self._process is not None:
            self.generation += 1
        kill(self._process, self._conn, self._finalizer)
        self._process = self._conn = self._finalizer = None

    @property
    def process(self) -> subprocess.Popen | None:
        """The worker process, if one is running."""
        return self._process

    def close(self) -> None:
        """Stop the worker process (a later request starts a new one)."""
        self._stop()

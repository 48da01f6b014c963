"""One reward worker process (`fn_worker`) and the time limit on each of its answers.

A call that takes longer than its limit kills the worker; the next call starts another. A
plain subprocess rather than multiprocessing: no fork of a process running JAX threads, and
unlike multiprocessing's spawn it does not re-run the caller's main module. The worker's
start (imports) is not counted against the limit: it says "ready" first.

Containment (`spawn`, `die_with_parent`): each worker leads its own process group, so a
kill (timeout, close, the owner collected) takes the processes the user's code started with
it, and a terminal's Ctrl-C or a launcher's signal to the trainer's group does not reach it
mid-call; every process it starts carries its token (`TOKEN_ENV`), so one that left the group
(a new session, a daemon's double fork) is found and killed with it (`kill_marked`); it ends
with them when the process that started it dies; the kernel's OOM
killer picks it before the trainer; it gets the environment without the secrets of the
services LoCoJAX talks to (`SECRET_ENV`).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import weakref
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

Answer = tuple[str, Any]
"""(`ok`, value), (`error`, first line of the exception), (`type`, what was returned that no
reward can be), (`timeout`, why) or (`died`, why)."""


def worker_pythonpath() -> str:
    """The package and the caller's own additions to sys.path, so that a `<module>:<name>`
    spec imports in a worker process as it does here."""
    root = str(Path(__file__).resolve().parents[2])
    added = [p for p in sys.path if p and not p.startswith((sys.prefix, sys.base_prefix))]
    return os.pathsep.join(dict.fromkeys(filter(None, [root, *added,
                                                       os.environ.get("PYTHONPATH")])))


SECRET_ENV = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
              "WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD",
              "MLFLOW_TRACKING_USERNAME")
"""Credentials of Ray, the Hub, wandb and MLflow: a worker of the user's code does not get
them (a reward that calls a service of its own still sees that service's variables)."""
PARENT_ENV = "LOCOJAX_WORKER_PARENT"
"""The pid that started a worker (`die_with_parent`)."""
MEMORY_ENV = "LOCOJAX_WORKER_MEMORY_MB"
"""A worker's address-space limit in MiB (`workload.reward_memory_mb`; absent or 0: none)."""
PARENT_POLL_S = 0.5
"""How often a worker looks whether its parent still lives."""
TOKEN_ENV = "LOCOJAX_WORKER_TOKEN"
"""A token of each worker process, inherited by every process its user code starts: what
`kill_marked` finds them by wherever they went (another session or process group, another
parent)."""


def worker_env(memory_mb: int = 0, token: str = "") -> dict[str, str]:
    """The environment of a worker process: ours without SECRET_ENV, its PYTHONPATH, its
    parent's pid, its memory limit (`MEMORY_ENV`), its token (`TOKEN_ENV`)."""
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    return env | {"PYTHONPATH": worker_pythonpath(), PARENT_ENV: str(os.getpid()),
                  MEMORY_ENV: str(int(memory_mb)), TOKEN_ENV: token}


def kill_marked(token: str, spare: int = 0) -> int:
    """SIGKILL every process of this user whose environment holds worker token `token` (but
    `spare`'s pid): what a worker's user code started, wherever it went; how many."""
    if not token:
        return 0
    mark, killed = f"{TOKEN_ENV}={token}".encode(), 0
    for pid in _pids():
        if pid in (spare, os.getpid()):
            continue
        try:
            marked = mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        if marked:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def _pids() -> list[int]:
    """Every process id in /proc (none where there is no /proc)."""
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


OOM_SCORE_ADJ = 1000
"""A worker's /proc/self/oom_score_adj: the kernel's out-of-memory killer takes a worker (the
user's code, whose call then answers `died`) before the trainer."""


def _first_for_the_oom_killer() -> None:
    """Make this process the OOM killer's first choice (Linux; elsewhere nothing)."""
    try:
        Path("/proc/self/oom_score_adj").write_text(str(OOM_SCORE_ADJ))
    except OSError:
        pass


def _limit_memory() -> None:
    """RLIMIT_AS of this process from `MEMORY_ENV` (nothing when absent or 0): an allocation
    past it raises MemoryError in the user's code instead of taking the machine's memory."""
    mib = int(os.environ.get(MEMORY_ENV, "0") or 0)
    if mib > 0:
        resource.setrlimit(resource.RLIMIT_AS, (mib << 20, mib << 20))


def die_with_parent() -> None:
    """In a worker: end, with its process group, once the process that started it is no
    longer its parent (it died; checked every PARENT_POLL_S by a daemon thread, which also
    works mid-call and where no parent-death signal exists); SIGINT and SIGHUP ignored (the
    trainer finishes its step, which needs the worker, then closes it); the OOM killer's
    first choice (`OOM_SCORE_ADJ`), so that user code running out of memory never takes the
    trainer; its address space limited when the run asks (`MEMORY_ENV`)."""
    _first_for_the_oom_killer()
    _limit_memory()
    parent = int(os.environ.get(PARENT_ENV, os.getppid()))

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        kill_marked(os.environ.get(TOKEN_ENV, ""))
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    for s in (signal.SIGINT, signal.SIGHUP):  # a Ctrl-C or a hang-up is the trainer's
        signal.signal(s, signal.SIG_IGN)


def _kill_group(process: subprocess.Popen, token: str = "") -> None:
    """SIGKILL to the worker's process group (it and what it started), once, then to what
    it started that left the group (`kill_marked`)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    kill_marked(token)


def spawn(module: str, args: list[str], owner: object, memory_mb: int = 0
          ) -> tuple[subprocess.Popen, Connection, weakref.finalize]:
    """`python -m <module> <socket fd> <args>` in a process group of its own, its address
    space limited to `memory_mb` MiB (0: none): the process, our end of its socketpair, and a
    finalizer that kills its group when `owner` is collected (no worker outlives its
    owner)."""
    parent, child = socket.socketpair()
    cmd = [sys.executable, "-m", module, str(child.fileno()), *args]
    token = uuid.uuid4().hex
    process = subprocess.Popen(cmd, pass_fds=[child.fileno()], stdin=subprocess.DEVNULL,
                               env=worker_env(memory_mb, token), start_new_session=True)
    child.close()
    process.locojax_token = token  # type: ignore[attr-defined]  # for `kill`
    return process, Connection(parent.detach()), weakref.finalize(owner, _kill_group, process,
                                                                  token)


def kill(process: subprocess.Popen | None, conn: Connection | None,
         finalizer: weakref.finalize | None) -> None:
    """Kill and reap a worker `spawn` started (with what it started), and close our end of
    its socket."""
    if finalizer is not None:
        finalizer.detach()
    if process is not None:
        _kill_group(process, getattr(process, "locojax_token", ""))
        process.wait()
    if conn is not None:
        conn.close()


class FnWorker:
    """A reward worker process; thread-safe (concurrent calls take turns)."""

    def __init__(self, preload: tuple[str, ...] = (), startup_timeout_s: float = 120.0,
                 memory_mb: int = 0) -> None:
        self.preload = preload
        """Modules and function specs the worker imports before it takes calls."""
        self.startup_timeout_s = startup_timeout_s
        self.memory_mb = memory_mb
        """The worker's address-space limit in MiB (0: none; `spawn`)."""
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._finalizer: weakref.finalize | None = None
        self.load_failures: tuple[str, ...] = ()
        """Why each `preload` entry the running worker could not import failed (one line
        each)."""

    def start(self) -> tuple[str, ...]:
        """Start the worker now (not at the first call); its `load_failures`. RuntimeError
        when it does not say ready within `startup_timeout_s`."""
        with self._lock:
            self._connection()
            return self.load_failures

    def _connection(self) -> Connection:
        """The live worker's socket, starting a worker if there is none or it died."""
        alive = self._process is not None and self._process.poll() is None
        if self._conn is not None and alive and not self._conn.poll(0):  # idle: nothing to read
            return self._conn
        self._stop()
        process, conn, self._finalizer = spawn("locojax.rewards.fn_worker", list(self.preload),
                                               self, self.memory_mb)
        try:
            said = conn.recv() if conn.poll(self.startup_timeout_s) else None
        except (EOFError, OSError):
            said = None
        ready = isinstance(said, tuple) and said[0] == "ready"
        self.load_failures = tuple(said[1]) if ready else ()
        self._process, self._conn = process, conn
        if not ready:
            self._stop()
            raise RuntimeError(f"reward worker did not start in {self.startup_timeout_s} s")
        return conn

    @property
    def process(self) -> subprocess.Popen | None:
        """The worker process, if one is running."""
        return self._process

    def _stop(self) -> None:
        kill(self._process, self._conn, self._finalizer)
        self._process = self._conn = self._finalizer = None

    def _answer(self, conn: Connection, timeout_s: float) -> Answer:
        try:
            if conn.poll(timeout_s):
                return conn.recv()
            answer: Answer = ("timeout", f"no answer within workload.reward_timeout_s="
                                         f"{timeout_s:g}")
        except (EOFError, OSError):
            answer = ("died", "the worker process died")
        self._stop()
        return answer

    def call(self, spec: str, kwargs: dict[str, list], timeout_s: float) -> Answer:
        """The function `spec` on the whole batch `kwargs`, within `timeout_s`."""
        with self._lock:
            conn = self._connection()
            try:
                conn.send(("call", spec, kwargs))
            except OSError:  # died since the liveness check
                self._stop()
                conn = self._connection()
                conn.send(("call", spec, kwargs))
            return self._answer(conn, timeout_s)

    def call_rows(self, spec: str, kwargs: dict[str, list], n: int,
                  timeout_s: float) -> list[Answer]:
        """The function `spec` on each of the n rows alone, each within `timeout_s`; a row
        past it (or one that kills the worker) is answered as such and the rest go on."""
        with self._lock:
            answers: list[Answer] = []
            while len(answers) < n:
                i = len(answers)
                conn = self._connection()
                try:
                    conn.send(("rows", spec, {k: v[i:] for k, v in kwargs.items()}, n - i))
                except OSError:
                    self._stop()
                    continue
                while len(answers) < n:
                    answer = self._answer(conn, timeout_s)
                    answers.append(answer)
                    if answer[0] in ("timeout", "died"):
                        break  # the worker was stopped: the next rows go to a new one
            return answers

    def close(self) -> None:
        """Stop the worker process (a later call starts a new one)."""
        with self._lock:
            self._stop()

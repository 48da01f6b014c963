"""`python -m locojax[.X]` runs for the tests, started from an already-imported process.

    warm.run(cmd, ...) / warm.Popen(cmd, ...)     as subprocess.run / subprocess.Popen
        cmd == [sys.executable, "-m", "locojax[.X]", ...] and the environment's import-time
        variables are this session's  -> forked by tests/workers/warm_server.py
        anything else                  -> subprocess, unchanged

The server (one per xdist worker, started on first use) has imported what every run imports
(~3.5 CPU-seconds a run, docs/testing.md) and forks each run before any JAX backend exists;
the child executes `locojax/__main__.py` as `-m` does, with the given argv, environment,
working directory and stdio. What a test sees is a process: its pid takes signals, its exit
status is the run's (negative for a signal), its pipes are its stdout and stderr. Tests of
how the interpreter itself starts (what `python -m locojax` imports) use subprocess.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

from paths import ROOT, WORKERS

IMPORT_TIME = ("JAX_", "PYTHON", "LD_", "HF_", "MPL", "TPU_", "OMP_", "OPENBLAS", "MKL_",
               "TOKENIZERS", "TF_", "XLA_PYTHON")
"""Environment variables read while modules are imported or the interpreter starts: a run
whose values differ from the server's starts as a subprocess."""
RUN_TIME = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
"""Read by the run when it joins its job (`locojax.launch.join`), not by JAX's import."""
SET_BY_LIBRARIES = ("PYTHONBREAKPOINT", "TPU_LIBRARY_PATH", "TPU_SKIP_MDS_QUERY",
                    "TF_CPP_MIN_LOG_LEVEL")
"""Set in the pytest process by what a test imports or starts in it (Ray's driver sets
PYTHONBREAKPOINT; importing libtpu and JAX's TPU set-up set the others), so they leak into
every later run's environment. A forked run still gets the test's values before it starts,
and none changes what an import does, so they do not make a run cold."""

_server: subprocess.Popen | None = None
_socket_path = ""
_server_env: dict[str, str] = {}
_lock = threading.Lock()


def _start(env: dict[str, str]) -> None:
    global _server, _socket_path, _server_env
    # Under /tmp, as the Ray tests' directories: a Unix socket's path takes 107 bytes at most.
    _socket_path = os.path.join(tempfile.mkdtemp(prefix="locojax-warm-", dir="/tmp"), "s")
    _server = subprocess.Popen([sys.executable, str(WORKERS / "warm_server.py"), _socket_path],
                               cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    _server_env = dict(env)
    assert _server.stdout.readline().strip() == "ready", "the warm server did not start"
    atexit.register(_stop)


def _stop() -> None:
    """End the server (it ends when its stdin does) and remove its socket's directory."""
    if _server is not None and _server.poll() is None:
        _server.stdin.close()
        try:
            _server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _server.kill()
    shutil.rmtree(os.path.dirname(_socket_path), ignore_errors=True)


def _import_time(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if k.startswith(IMPORT_TIME) and k not in RUN_TIME + SET_BY_LIBRARIES}


def cold_reason(cmd, env: dict[str, str] | None = None) -> str:
    """Why `cmd` with `env` (default: this process's) would start as a subprocess; "" if the
    server forks it."""
    cmd, env = [str(c) for c in cmd], dict(os.environ) if env is None else env
    if len(cmd) < 3 or cmd[:2] != [sys.executable, "-m"] or cmd[2].split(".")[0] != "locojax":
        return "not `python -m locojax[.X]`"
    with _lock:
        if _server is None:
            from shared_runs import run_env

            _start(run_env())
    if _server.poll() is not None:
        return f"the warm server ended ({_server.returncode})"
    ours, theirs = _import_time(env), _import_time(_server_env)
    differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    return f"import-time variables differ from the server's: {differ}" if differ else ""


def _warm(cmd, env: dict[str, str]) -> bool:
    """Whether `cmd` is `python -m locojax[.X] ...` that the server can start with `env`."""
    return not cold_reason(cmd, env)


def _fd(spec, default: int, opened: list[int], stdout_fd: int | None = None) -> int:
    """The file descriptor a Popen-style stdio argument names (a duplicate, closed later)."""
    if spec is None:
        fd = os.dup(default)
    elif spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
    elif spec == subprocess.STDOUT:
        fd = os.dup(stdout_fd)
    elif isinstance(spec, int):
        fd = os.dup(spec)
    else:
        fd = os.dup(spec.fileno())
    opened.append(fd)
    return fd


class WarmProcess:
    """The part of subprocess.Popen the tests use, for a run the server forked."""

    def __init__(self, cmd, *, env=None, cwd=None, stdin=None, stdout=None, stderr=None,
                 text=False, universal_newlines=None, encoding=None, errors=None,
                 start_new_session=False):
        self.args = cmd
        self.returncode: int | None = None
        text = bool(text or universal_newlines or encoding or errors)
        opened: list[int] = []
        ours: dict[str, int] = {}
        fds: list[int] = []
        if stdin == subprocess.PIPE:
            read, write = os.pipe()
            ours["stdin"] = write
            opened.append(read)
            fds.append(read)
        else:
            fds.append(_fd(stdin if stdin is not None else subprocess.DEVNULL, 0, opened))
        for name, spec, default in (("stdout", stdout, 1), ("stderr", stderr, 2)):
            if spec == subprocess.PIPE:
                read, write = os.pipe()
                ours[name] = read
                opened.append(write)
                fds.append(write)
            else:
                fds.append(_fd(spec, default, opened, stdout_fd=fds[-1]))
        request = {"module": str(cmd[2]), "args": [str(c) for c in cmd[3:]],
                   "env": dict(env or os.environ),
                   "cwd": str(cwd or os.getcwd()), "new_session": bool(start_new_session)}
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(_socket_path)
        socket.send_fds(self._conn, [json.dumps(request).encode()], fds)
        for fd in opened:
            os.close(fd)
        self._reader = self._conn.makefile("r")
        self.pid = int(self._reader.readline())
        for name in ("stdin", "stdout", "stderr"):
            fd, mode = ours.get(name), "w" if name == "stdin" else "r"
            stream = None
            if fd is not None:
                stream = (open(fd, mode, encoding=encoding, errors=errors) if text
                          else open(fd, mode + "b"))
            setattr(self, name, stream)

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def _read_status(self) -> None:
        line = self._reader.readline()
        self.returncode = int(line) if line.strip() else -9
        self._reader.close()
        self._conn.close()

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read_status()
        return self.returncode

    def communicate(self, input=None, timeout: float | None = None) -> tuple:
        if self.stdin:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        results: dict[str, object] = {}
        threads = [threading.Thread(target=lambda n=n, s=s: results.__setitem__(n, s.read()),
                                    daemon=True)
                   for n, s in (("stdout", self.stdout), ("stderr", self.stderr)) if s]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        for s in (self.stdout, self.stderr):
            if s:
                s.close()
        self.wait(timeout)
        return results.get("stdout"), results.get("stderr")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for s in (self.stdout, self.stderr):
            if s:
                s.close()
        self.wait()


def Popen(cmd, **kw):  # noqa: N802 (subprocess's name)
    """subprocess.Popen, or a WarmProcess for a `python -m locojax[.X]` run (module
    docstring)."""
    if _warm(cmd, kw.get("env") or dict(os.environ)):
        return WarmProcess(cmd, **kw)
    return subprocess.Popen(cmd, **kw)


def run(cmd, *, capture_output=False, timeout=None, check=False, **kw):
    """subprocess.run, or the same through a WarmProcess for a `python -m locojax[.X]` run."""
    if not _warm(cmd, kw.get("env") or dict(os.environ)):
        return subprocess.run(cmd, capture_output=capture_output, timeout=timeout, check=check,
                              **kw)
    if capture_output:
        kw["stdout"] = kw["stderr"] = subprocess.PIPE
    data = kw.pop("input", None)
    if data is not None:
        kw["stdin"] = subprocess.PIPE
    proc = WarmProcess(cmd, **kw)
    try:
        out, err = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check:
        result.check_returncode()
    return result




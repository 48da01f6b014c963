"""Test worker: starts `python -m locojax[.X]` runs from a process that has already imported
them.

Usage: python tests/workers/warm_server.py SOCKET_PATH   (started by tests/warm.py)

    client --(module, argv, env, cwd, session; stdin/stdout/stderr fds over SCM_RIGHTS)--> server
    server: fork -> child: fds on 0/1/2, env, cwd, signals as a new process has them,
                    runpy MODULE as __main__ (what `python -m MODULE` runs), exit code
    server --(pid, then the exit status when the child ends)--> client

A run's process imports JAX, Flax, Optax, Orbax, Hydra, matplotlib and the runtime before its
first line of work: ~3.5 of a 4-step run's ~12 CPU-seconds here. This process imports them
once and forks each run from that state (before any JAX backend exists, so each run's
XLA_FLAGS and device count are its own); the run then executes `locojax/__main__.py` exactly
as `-m` would. tests/warm.py sends a run here only if its environment matches this process's
in every variable read at import time (JAX_*, PYTHON*, ...).
"""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading

os.environ.setdefault("MPLBACKEND", "Agg")
import flax.nnx  # noqa: E402, F401
import jax  # noqa: E402, F401
import matplotlib.pyplot  # noqa: E402, F401
import optax  # noqa: E402, F401
import orbax.checkpoint  # noqa: E402, F401

import locojax.__main__  # noqa: E402, F401
import locojax.co.host  # noqa: E402, F401
import locojax.launch.dispatch  # noqa: E402, F401

MAX_REQUEST = 1 << 20


def _exit_code(exc: SystemExit) -> int:
    """The exit status Python gives a `SystemExit` that reaches the top."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _become_run(request: dict, fds: list[int]) -> None:
    """In the forked child: take the run's stdio, environment and directory, run
    `python -m MODULE ARGS` and exit with its code. Never returns."""
    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                          else signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        module = request["module"]
        spec = importlib.util.find_spec(module)
        main = f"{module}.__main__" if spec.submodule_search_locations else module
        sys.argv = [importlib.util.find_spec(main).origin, *request["args"]]
        sys.orig_argv = [sys.executable, "-m", module, *request["args"]]
        sys.path[0] = os.getcwd()  # what `-m` puts first
        sys.modules.pop(main, None)  # executed afresh as __main__, as `-m` does
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        threading._shutdown()  # what the interpreter does at exit: join non-daemon threads
        import atexit

        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def serve(path: str) -> None:
    """Accept runs on the Unix socket `path` until the client closes it (or stdin ends)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    runs: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            if key.data == "stdin" and not sys.stdin.readline():
                return
            if key.data == "child":
                os.read(wake_r, 4096)
            if key.data == "accept":
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    listener.close()
                    conn.close()
                    _become_run(json.loads(message), fds)
                for fd in fds:
                    os.close(fd)
                conn.sendall(f"{pid}\n".encode())
                runs[pid] = conn
        for pid in list(runs):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                conn = runs.pop(pid)
                try:
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                finally:
                    conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])

"""Reward worker process: `python -m locojax.rewards.fn_worker <socket fd>`.

Runs reward functions (the user's and the built-in ones alike) for the scorer. Messages:
("call", spec, kwargs) calls the function once on the whole batch and answers one
("ok", values) or ("error", first line); ("rows", spec, kwargs, n) calls it on each of the n
rows alone and answers once per row, so that the parent can time each row. None ends it.
The modules and functions named after the socket are imported (and `warm:<spec>` functions
called) before it says ("ready", failures), so that this does not count against the first
call's limit; `failures` is one line per entry that could not be imported (the user's module
is imported here, never in the trainer). Started as a plain
subprocess, not through multiprocessing, so it never re-imports the
caller's main module.
"""

from __future__ import annotations

import importlib
import sys
from multiprocessing.connection import Connection

from locojax.rewards.python_fns import WARM, RewardFnError, first_line, load_fn
from locojax.rewards.worker import die_with_parent


def _plain(out: object) -> tuple[str, object]:
    """The function's return value as plain floats (None kept), converted here, so that no
    object of the user's is unpickled, nor its `__float__` run, in the trainer. ("type", what)
    for a value that is not a sequence of numbers (a str, a dict, a scalar): the user's bug."""
    if out is None:
        return "ok", None
    if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__iter__"):
        return "type", f"returned a {type(out).__name__}"
    values: list[float | None] = []
    for v in out:
        if v is not None and isinstance(v, (str, bytes, list, tuple, dict)):
            return "type", f"returned a {type(v).__name__} value ({str(v)[:40]!r})"
        values.append(None if v is None else float(v))
    return "ok", values


def _run(fns: dict, spec: str, kwargs: dict) -> tuple[str, object]:
    try:
        fn = fns.get(spec) or fns.setdefault(spec, load_fn(spec))
        return _plain(fn(**kwargs))
    except BaseException as e:  # noqa: BLE001 - the user's code: any failure scores 0
        return "error", f"{type(e).__name__}: {first_line(e)}"


def _load(name: str, fns: dict) -> str | None:
    """Import one `preload` entry; None, or the one line saying why it failed."""
    try:
        if name.startswith(WARM):
            load_fn(name.removeprefix(WARM))()
        elif ":" in name:
            fns[name] = load_fn(name)
        else:
            importlib.import_module(name)
    except RewardFnError as e:
        return str(e)
    except BaseException as e:  # noqa: BLE001 - the user's import, even sys.exit: said
        return f"reward function {name!r}: importing it raised {type(e).__name__}: " \
               f"{first_line(e)}"
    return None


def serve(conn: Connection, preload: list[str]) -> None:
    """Import `preload` (modules, or specs of functions), say ("ready", [why each failed]),
    then answer calls until the parent sends None or goes away."""
    fns: dict = {}
    failures = [line for name in preload if (line := _load(name, fns)) is not None]
    conn.send(("ready", failures))
    try:
        while (msg := conn.recv()) is not None:
            if msg[0] == "call":
                conn.send(_run(fns, msg[1], msg[2]))
                continue
            _, spec, kwargs, n = msg
            for i in range(n):
                status, out = _run(fns, spec, {k: v[i:i + 1] for k, v in kwargs.items()})
                if status == "ok" and (out is None or len(out) != 1):  # type: ignore[arg-type]
                    status, out = "error", f"returned {out!r} for one completion"
                elif status == "ok":
                    out = out[0]
                conn.send((status, out))
    except (EOFError, OSError):
        pass  # the parent closed the socket or exited


if __name__ == "__main__":
    # A group of its own (`worker.spawn`): Ctrl-C and a launcher's SIGTERM reach the trainer,
    # which finishes its step (it needs these scores), then ends this worker (EOF); a trainer
    # that is killed takes it along (`die_with_parent`'s watch of the parent pid).
    die_with_parent()
    sys.setrecursionlimit(10_000)  # deep LaTeX nests; past this a RecursionError scores 0
    serve(Connection(int(sys.argv[1])), sys.argv[2:])

"""Reward functions of the user's (`workload.reward=python`), each call in a worker process.

A function `fn(prompts=[...], completions=[...], **columns)` returns one float (or None: not
applicable) per completion. Every call runs in a worker process under the time limit
`workload.reward_timeout_s`: a timeout or an exception scores 0 for that batch's rows, is
counted, and is told in one warning line (function, first row id, the exception's first line);
the run goes on. A wrong length or a non-finite value is the user's bug: `RewardFnError`, one
line naming the function (exit 2 at the door).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import math
import multiprocessing as mp
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


class RewardFnError(ValueError):
    """A reward function of the user's cannot be loaded or broke its contract (one line)."""


def split_spec(spec: str) -> tuple[str, str]:
    """(`<file.py>` or `<module>`, `<function>`) of `spec`; RewardFnError when malformed."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise RewardFnError(f"reward function {spec!r}: write <path/to/file.py>:<function> "
                            f"or <module>:<function>")
    return where, name


def load_fn(spec: str) -> Callable[..., Any]:
    """The function `spec` names, imported from its file or module."""
    where, name = split_spec(spec)
    try:
        if where.endswith(".py"):
            path = Path(where).expanduser().resolve()
            if not path.is_file():
                raise RewardFnError(f"reward function {spec!r}: no file {path}")
            mod_name = f"locojax_user_reward_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
            module = sys.modules.get(mod_name)
            if module is None:
                loader = importlib.util.spec_from_file_location(mod_name, path)
                assert loader is not None and loader.loader is not None
                module = importlib.util.module_from_spec(loader)
                sys.modules[mod_name] = module
                loader.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except RewardFnError:
        raise
    except Exception as e:
        raise RewardFnError(f"reward function {spec!r}: cannot import {where}: "
                            f"{type(e).__name__}: {_first_line(e)}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RewardFnError(f"reward function {spec!r}: {where} has no function {name!r}")
    return fn


def fn_digest(spec: str) -> str:
    """sha256 of the file a spec names (a module's file where it has one), for the run record."""
    where, _ = split_spec(spec)
    if where.endswith(".py"):
        path = Path(where).expanduser()
    else:
        found = importlib.util.find_spec(where)
        path = Path(found.origin) if found is not None and found.origin else None
    if path is None or not path.is_file():
        return "missing"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def _worker(conn) -> None:
    """Worker loop: (spec, kwargs) in, ("ok", values) or ("error", first line) out."""
    fns: dict[str, Callable[..., Any]] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        spec, kwargs = msg
        try:
            fn = fns.get(spec) or fns.setdefault(spec, load_fn(spec))
            out = fn(**kwargs)
            conn.send(("ok", list(out) if out is not None else None))
        except BaseException as e:  # noqa: BLE001 - the user's code: any failure scores 0
            conn.send(("error", f"{type(e).__name__}: {_first_line(e)}"))


@dataclass(frozen=True)
class FnScores:
    """One function's scores on one batch."""

    values_B: np.ndarray
    """float32 scores (0 where not applicable or failed)."""
    applicable_B: np.ndarray
    """bool: the function returned a number for this row."""
    failed: str | None
    """None, `timeout` or `error`: the whole batch scored 0."""


class PythonRewards:
    """The user's functions and their weights; one worker process, restarted after a timeout."""

    def __init__(self, fns: Mapping[str, str], weights: Mapping[str, float],
                 timeout_s: float) -> None:
        if not fns:
            raise RewardFnError("workload.reward=python needs workload.reward_fns "
                                "(+workload.reward_fns.<name>=<file.py>:<function>)")
        unknown = sorted(set(weights) - set(fns))
        if unknown:
            raise RewardFnError(f"workload.reward_weights.{unknown[0]}: no such function in "
                                f"workload.reward_fns ({', '.join(fns)})")
        for name, spec in fns.items():
            load_fn(spec)  # fail early, in this process, on a bad path or name
            if not math.isfinite(float(weights.get(name, 1.0))):
                raise RewardFnError(f"workload.reward_weights.{name}: not a finite number")
        self.fns = dict(fns)
        self.weights = {n: float(weights.get(n, 1.0)) for n in fns}
        self.timeout_s = timeout_s
        self._proc: Any = None
        self._conn: Any = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        self._proc.start()
        child.close()

    def _call(self, spec: str, kwargs: dict[str, list]) -> tuple[str, Any]:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        self._conn.send((spec, kwargs))
        if self._conn.poll(self.timeout_s):
            try:
                return self._conn.recv()
            except EOFError:
                pass
        self._stop()
        return "timeout", f"no answer within workload.reward_timeout_s={self.timeout_s}"

    def score(self, name: str, kwargs: dict[str, list], row_ids: Sequence[str]) -> FnScores:
        """Scores of function `name` on one batch (kwargs: prompts, completions, columns)."""
        n = len(kwargs["completions"])
        status, out = self._call(self.fns[name], kwargs)
        if status != "ok":
            log.warning("reward function %s: %s on the batch from row %s: %s; its rows score 0",
                        name, status, row_ids[0] if row_ids else "?", out)
            failed = "timeout" if status == "timeout" else "error"
            return FnScores(np.zeros(n, np.float32), np.zeros(n, bool), failed)
        if out is None or len(out) != n:
            got = "None" if out is None else f"{len(out)} values"
            raise RewardFnError(f"reward function {name} ({self.fns[name]}) returned {got} for "
                                f"{n} completions: return one float (or None) per completion")
        applicable = np.array([v is not None for v in out], bool)
        values = []
        for v in out:
            try:
                x = 0.0 if v is None else float(v)
            except (TypeError, ValueError):
                x = math.nan
            if not math.isfinite(x):
                raise RewardFnError(f"reward function {name} ({self.fns[name]}) returned "
                                    f"{v!r}: return a finite float (or None) per completion")
            values.append(x)
        return FnScores(np.asarray(values, np.float32), applicable, None)

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        """Stop the worker process."""
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._proc.join(2)
            except OSError:
                pass
        self._stop()

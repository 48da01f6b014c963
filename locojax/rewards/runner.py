"""Run a set of reward functions on a batch, in worker processes, each call time-limited.

Every reward is a function of one interface, `fn(prompts=[...], completions=[...],
**columns) -> list[float | None]`: the user's (`workload.reward=python`) and the built-in
`gsm8k` and `boxed` (`builtin`) alike, all through `RewardFns.score`. Rows are spread over
the workers in contiguous chunks: a user's function and `gsm8k` are called once per worker's
chunk under `workload.reward_timeout_s` times its rows, `boxed` one row at a time, each row
under the limit (a math-verify check can hang in C code). A timeout or an exception scores 0
for that call's rows, is counted (`FnScores.failure` the first) and tallied (`tally`: the
step tells it in one warning line: function, count, first row id, the exception's first
line); whether the run goes on is the
scorer's rule (`failures.FailureWatch`). A wrong length or a non-finite value is the user's bug:
`RewardFnError`, one line naming the function (exit 2 at the door).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from locojax.rewards.python_fns import RewardFnError, split_spec
from locojax.rewards.tally import Tally
from locojax.rewards.worker import Answer, FnWorker


@dataclass(frozen=True)
class RewardFn:
    """One reward function of a set."""

    name: str
    """Its name in `reward/<name>` and in messages."""
    spec: str
    """`<file.py>:<function>` or `<module>:<function>`."""
    weight: float = 1.0
    """Its weight in the reward (the weighted sum)."""
    per_row: bool = False
    """Call it on one row at a time, each row under the time limit (`boxed`)."""
    min_rows_per_worker: int = 0
    """Rows per worker below which fewer workers are used (0: one call on the whole batch)."""
    limit_per_row: bool = False
    """The limit of a call is the time limit times its rows (`gsm8k`: verdicts that always
    end, where one message per row would cost more than the verdict)."""
    preload: tuple[str, ...] = ()
    """Modules its worker imports before taking calls (their import is not timed)."""


@dataclass(frozen=True)
class FnScores:
    """One function's scores on one batch."""

    values_B: np.ndarray
    """float32 scores (0 where not applicable or failed)."""
    applicable_B: np.ndarray
    """bool: the function returned a number for this row."""
    failed_B: np.ndarray
    """bool: the row scored 0 because the call timed out or raised."""
    timeouts: int
    """Calls (or rows, with `per_row`) stopped at the time limit."""
    errors: int
    """Calls (or rows) that raised, or whose worker died."""
    failure: str = ""
    """The first failure of the batch: its kind (timeout, error, died), the first row's id
    and the exception's first line ("" when none failed)."""


def _chunks(n: int, k: int) -> list[tuple[int, int]]:
    """[a, b) bounds of at most k contiguous near-equal chunks of range(n) (none empty)."""
    k = max(min(k, n), 1)
    bounds = [n * i // k for i in range(k + 1)]
    return list(zip(bounds, bounds[1:], strict=False))


FLOAT32_MAX = float(np.finfo(np.float32).max)
"""The largest reward a float32 row holds; past it the sum would be inf."""


def _value(fn: RewardFn, v: object) -> float:
    x = 0.0 if v is None else float(v)  # type: ignore[arg-type]  # plain floats (fn_worker)
    if not (math.isfinite(x) and abs(x) <= FLOAT32_MAX):
        raise RewardFnError(f"reward function {fn.name} ({fn.spec}) returned {v!r}: return a "
                            f"finite float32 (or None) per completion")
    return x


def _types_checked(fn: RewardFn, answers: list[Answer]) -> list[Answer]:
    """`answers`, or RewardFnError (one line) when one is of a type no reward can be."""
    bad = next((a for a in answers if a[0] == "type"), None)
    if bad is not None:
        raise RewardFnError(f"reward function {fn.name} ({fn.spec}) {bad[1]}: return a list "
                            "of floats (or None), one per completion")
    return answers


class RewardFns:
    """A set of reward functions and the worker processes (up to `workers`) they run in."""

    def __init__(self, fns: Sequence[RewardFn], timeout_s: float, workers: int = 1,
                 memory_mb: int = 0) -> None:
        for fn in fns:
            split_spec(fn.spec)  # its form, here; its import, in the worker
            if not math.isfinite(fn.weight):
                raise RewardFnError(f"workload.reward_weights.{fn.name}: not a finite number")
        self.fns = tuple(fns)
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        """Each worker's address-space limit in MiB (0: none)."""
        self.workers: list[FnWorker] = []
        self._max_workers = max(int(workers), 1)
        self._preload = tuple(dict.fromkeys(m for fn in fns for m in (*fn.preload, fn.spec)))
        self._threads: ThreadPoolExecutor | None = None
        self.tallies = {fn.name: Tally(f"reward function {fn.name}", "row(s), scored 0")
                        for fn in self.fns}
        """Each function's failures since they were last told (`runtime.hostwork.say_failures`:
        one line per step)."""
        self._check_imports()

    def _check_imports(self) -> None:
        """Start the first worker now: a path, module or name that does not import (or an
        import that exits or hangs) stops the run before its first step, in one line. The
        functions are imported in the worker only, never in this (the trainer's) process."""
        first = self._pool(1)[0][0]
        try:
            failures = first.start()
        except RuntimeError:
            self.close()
            raise RewardFnError(f"reward functions {', '.join(fn.spec for fn in self.fns)}: "
                                f"importing them took over {first.startup_timeout_s:g} s") \
                from None
        if failures:
            self.close()
            raise RewardFnError(failures[0])

    def _pool(self, k: int) -> tuple[list[FnWorker], ThreadPoolExecutor]:
        while len(self.workers) < k:
            self.workers.append(FnWorker(self._preload, memory_mb=self.memory_mb))
        if self._threads is None:
            self._threads = ThreadPoolExecutor(self._max_workers, thread_name_prefix="reward")
        return self.workers[:k], self._threads

    def score(self, fn: RewardFn, kwargs: dict[str, list], row_ids: Sequence[str],
              shared: dict | None = None) -> FnScores:
        """Scores of `fn` on one batch (kwargs: prompts, completions, columns, one value per
        row; `shared`: keyword arguments every call gets whole, e.g. `trainer_state`, given
        to whole-chunk calls only)."""
        n = len(kwargs["completions"])
        if n == 0:
            empty = np.zeros(0, np.float32)
            return FnScores(empty, empty.astype(bool), empty.astype(bool), 0, 0)
        answers, calls = self._spread(fn, kwargs, n, shared or {})
        failed = [a for a in answers if a[0] != "ok"]
        failure = ""
        if failed:
            first = next(i for i, a in enumerate(answers) if a[0] != "ok")
            failure = (f"{failed[0][0]} on the rows from {row_ids[first] if row_ids else first}"
                       f": {failed[0][1]}")
            self.tallies[fn.name].add(len(failed), failure)
        ok = [a[0] == "ok" for a in answers]
        return FnScores(
            np.asarray([_value(fn, a[1]) if good else 0.0 for a, good in zip(answers, ok,
                                                                              strict=True)],
                       np.float32).reshape(n),
            np.asarray([good and a[1] is not None for a, good in zip(answers, ok, strict=True)],
                       bool).reshape(n),
            ~np.asarray(ok, bool).reshape(n),
            sum(a[0] == "timeout" for a in calls),
            sum(a[0] in ("error", "died") for a in calls), failure)

    def _listed(self, fn: RewardFn, answer: Answer, n: int) -> list[Answer]:
        """One answer per row of a call's answer (a failed call: its failure on every row)."""
        status, out = answer
        if status != "ok":
            return [answer] * n
        if not isinstance(out, list) or len(out) != n:
            got = "None" if out is None else f"{len(out)} values"  # type: ignore[arg-type]
            raise RewardFnError(f"reward function {fn.name} ({fn.spec}) returned {got} for "
                                f"{n} completions: return one float (or None) per completion")
        return [("ok", v) for v in out]

    def _spread(self, fn: RewardFn, kwargs: dict[str, list], n: int,
                shared: dict) -> tuple[list[Answer], list[Answer]]:
        """(one answer per row, one per call) of `fn` on the batch, its rows spread over the
        workers in contiguous chunks (a user's function: one call on the whole batch)."""
        per = fn.min_rows_per_worker
        chunks = _chunks(n, min(self._max_workers, n // per) if per else 1)
        workers, threads = self._pool(len(chunks))

        def run(worker: FnWorker, bounds: tuple[int, int]) -> tuple[list[Answer], list[Answer]]:
            a, b = bounds
            part = {key: v[a:b] for key, v in kwargs.items()}
            if fn.per_row:
                got = _types_checked(fn, worker.call_rows(fn.spec, part, b - a, self.timeout_s))
                return got, got
            limit = self.timeout_s * ((b - a) if fn.limit_per_row else 1)
            answer = _types_checked(fn, [worker.call(fn.spec, part | shared, limit)])[0]
            return self._listed(fn, answer, b - a), [answer]

        results = list(threads.map(run, workers, chunks))
        return [x for r, _ in results for x in r], [x for _, c in results for x in c]

    def close(self) -> None:
        """Stop the worker processes."""
        for w in self.workers:
            w.close()
        self.workers = []
        if self._threads is not None:
            self._threads.shutdown()
            self._threads = None

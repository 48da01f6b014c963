"""Score a batch of completions: the weighted sum of reward functions, on worker processes.

    kind gsm8k | boxed ──builtin──> one function, 1.0 when correct, + the format bonus
    kind python ──workload.reward_fns──> the user's functions, weighted
        ──RewardFns.score (worker processes, time limits)──> RewardBatch
        (a function failing on every row, or on reward_max_fail_steps consecutive batches:
        RewardFnError, `failures`)

Correct (accuracy, pass@k, maj@k): a built-in kind's 1.0; with kind python, one function's
value >= the threshold (`workload.correct`), else the weighted sum >= it
(`workload.correct_threshold` alone), else unknown (`RewardBatch.correct_B` is None).

Every reward is a function of one interface (`runner`), called in the scorer's worker
processes (up to `workers`, one per core of the host it runs on, as the caller decides).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from compiler.sections import WorkloadConfig
from compiler.vocab import RewardKind
from locojax.rewards.builtin import (
    builtin,
    is_formatted,
    preload_of,
    spec_of,
)
from locojax.rewards.failures import FailureWatch
from locojax.rewards.python_fns import RewardFnError
from locojax.rewards.runner import FnScores, RewardFn, RewardFns

_WORKLOAD = WorkloadConfig()
"""The schema's workload defaults, which `RewardSettings` takes (each default written once)."""


@dataclass(frozen=True)
class RewardSettings:
    """What the scorer needs from the workload."""

    kind: RewardKind = _WORKLOAD.reward
    """Final-answer match (`gsm8k`), math-verify equivalence of `\\boxed{}` (`boxed`), or the
    user's functions (`python`)."""
    format_reward: float = _WORKLOAD.format_reward
    """Bonus for a well-formed answer, whatever its value (built-in kinds)."""
    timeout_s: float = _WORKLOAD.reward_timeout_s
    """Time limit per row of a call (a built-in check, or a function on a worker's rows); a
    timeout scores 0."""
    memory_mb: int = _WORKLOAD.reward_memory_mb
    """Address-space limit of each worker process in MiB (0: none)."""
    reward_max_fail_steps: int = _WORKLOAD.reward_max_fail_steps
    """Consecutive batches with a failure of one function that stop the run
    (`failures.FailureWatch`)."""
    reward_fns: dict[str, str] = field(default_factory=dict)
    """With kind `python`: name -> `<file.py>:<function>` or `<module>:<function>`."""
    reward_weights: dict[str, float] = field(default_factory=dict)
    """Name -> weight in the reward (1 when not given)."""
    correct: str | None = _WORKLOAD.correct
    """With kind `python`: the function whose value >= `correct_threshold` makes a completion
    correct (None: see `correct_threshold`)."""
    correct_threshold: float | None = _WORKLOAD.correct_threshold
    """With `correct`: its threshold (None: `CORRECT_THRESHOLD`); alone: the threshold on the
    weighted sum; neither: correctness is unknown."""


RESERVED_COLUMNS = frozenset({"prompts", "completions", "prompt", "completion"})
"""Row columns not passed on as keyword lists: the prompt and completion themselves (TRL
drops its `prompt` and `completion` columns the same way)."""
CORRECT_THRESHOLD = 1.0
"""The threshold on the function `workload.correct` names when `correct_threshold` is None:
its 1 is a right answer, as the built-ins' is."""
UNJUDGED = ("accuracy: not reported: workload.reward=python without workload.correct or "
            "workload.correct_threshold; set one to define a correct answer (docs/tasks.md)")


def unjudged_line(workload: WorkloadConfig) -> str | None:
    """The line a run (and `locojax-eval`) prints at start when `workload` leaves correctness
    unknown (reward `python` with neither `correct` nor `correct_threshold`), else None."""
    known = (workload.reward != RewardKind.python or workload.correct is not None
             or workload.correct_threshold is not None)
    return None if known else UNJUDGED


@dataclass(frozen=True)
class RewardBatch:
    """Rewards of B completions and what went into them."""

    rewards_B: np.ndarray
    """float32: the weighted sum (built-ins: 1 if correct, else `format_reward` if formatted,
    else 0)."""
    correct_B: np.ndarray | None
    """bool: the final answer matches the reference (`python`: `RewardSettings.correct`'s
    function, or the weighted sum, reached the threshold); None: unknown (kind `python`
    with neither set), and accuracy, pass@k and maj@k are not reported."""
    formatted_B: np.ndarray
    """bool: the answer is well formed (`#### n` or a closed `\\boxed{}`; `python`: True)."""
    timeouts: int
    """Calls (built-ins: rows) stopped at the time limit (scored 0)."""
    errors: int
    """Calls (built-ins: rows) that raised or whose worker process died (scored 0)."""
    seconds: float
    """Wall time of the whole batch."""
    fn_sums: dict[str, float] = field(default_factory=dict)
    """With kind `python`: each function's score summed over the rows it applied to."""
    fn_counts: dict[str, int] = field(default_factory=dict)
    """Rows each function returned a number for (its mean is fn_sums / fn_counts)."""
    fn_failed: dict[str, int] = field(default_factory=dict)
    """Rows each function failed on (timeout or exception, scored 0)."""

    @classmethod
    def concat(cls, parts: Sequence[RewardBatch]) -> RewardBatch:
        """The rows of `parts` in order, their counts and seconds summed (one step's
        batches under dynamic sampling)."""
        if len(parts) == 1:
            return parts[0]

        def summed(name: str) -> dict:
            out: dict = {}
            for p in parts:
                for k, v in getattr(p, name).items():
                    out[k] = out.get(k, 0) + v
            return out

        unknown = any(p.correct_B is None for p in parts)
        return cls(rewards_B=np.concatenate([p.rewards_B for p in parts]),
                   correct_B=None if unknown else np.concatenate([p.correct_B for p in parts]),
                   formatted_B=np.concatenate([p.formatted_B for p in parts]),
                   timeouts=sum(p.timeouts for p in parts), errors=sum(p.errors for p in parts),
                   seconds=sum(p.seconds for p in parts), fn_sums=summed("fn_sums"),
                   fn_counts=summed("fn_counts"), fn_failed=summed("fn_failed"))


def reward_fns(settings: RewardSettings) -> list[RewardFn]:
    """The functions a kind scores with: the built-in one, or the user's with their weights."""
    kind = RewardKind(settings.kind)  # ValueError on an unknown kind, not a silent default
    if kind != RewardKind.python:
        key = "correct" if settings.correct is not None else "correct_threshold"
        if getattr(settings, key) is not None:
            raise RewardFnError(f"workload.{key}: set with workload.reward={kind}, which "
                                "judges correctness itself (workload.reward=python only)")
        b = builtin(kind)
        return [RewardFn(str(kind), spec_of(kind), 1.0, per_row=b.per_row,
                         min_rows_per_worker=b.min_rows_per_worker,
                         limit_per_row=b.limit_per_row, preload=b.preload)]
    if not settings.reward_fns:
        raise RewardFnError("workload.reward=python needs workload.reward_fns "
                            "(+workload.reward_fns.<name>=<file.py>:<function>)")
    unknown = sorted(set(settings.reward_weights) - set(settings.reward_fns))
    if unknown:
        raise RewardFnError(f"workload.reward_weights.{unknown[0]}: no such function in "
                            f"workload.reward_fns ({', '.join(settings.reward_fns)})")
    if settings.correct is not None and settings.correct not in settings.reward_fns:
        raise RewardFnError(f"workload.correct={settings.correct}: no such function in "
                            f"workload.reward_fns ({', '.join(settings.reward_fns)})")
    return [RewardFn(name, spec, float(settings.reward_weights.get(name, 1.0)),
                     min_rows_per_worker=1, limit_per_row=True, preload=preload_of(spec))
            for name, spec in settings.reward_fns.items()]


def python_correct(settings: RewardSettings, rewards_B: np.ndarray,
                   scores: dict[str, FnScores]) -> np.ndarray | None:
    """Which completions are correct with kind `python` (their weighted sums `rewards_B`,
    each function's `scores`): `settings.correct`'s function returned a number >= the
    threshold (a row it gave None for, or failed on, is not correct), else the weighted sum
    is >= `correct_threshold`; None when neither is set."""
    if settings.correct is not None:
        got = scores[settings.correct]
        threshold = settings.correct_threshold
        return got.applicable_B & (got.values_B >= (CORRECT_THRESHOLD if threshold is None
                                                     else threshold))
    if settings.correct_threshold is not None:
        return rewards_B >= settings.correct_threshold
    return None


class Scorer:
    """Turns completions (and their rows) into rewards; close() stops its workers."""

    def __init__(self, settings: RewardSettings, workers: int = 1) -> None:
        self.settings = settings
        self.fns = RewardFns(reward_fns(settings), settings.timeout_s, workers,
                             settings.memory_mb)
        self.failures = FailureWatch(settings.reward_max_fail_steps)
        self.trainer_state: dict[str, float] | None = None
        """`trainer_state` of the user's functions, as TRL passes it (`step`, `epoch`): set by
        the loop before a step's batches (`set_step`); None outside training."""

    def set_step(self, step: int, prompts_per_step: int, train_rows: int) -> None:
        """The training step the next batches belong to: `trainer_state` = {step, epoch}
        (epoch: prompts drawn so far over the train rows, a float as TRL's)."""
        self.trainer_state = {"step": step,
                              "epoch": step * prompts_per_step / max(train_rows, 1)}

    def score_batch(self, completions: Sequence[object], references: Sequence[str],
                    prompts: Sequence[object] | None = None,
                    columns: Sequence[dict] | None = None,
                    row_ids: Sequence[str] | None = None) -> RewardBatch:
        """Score completions[i] against references[i] (the `answer` column) with the kind's
        functions, called on the prompts, completions and the rows' other columns.
        Completions are texts; for functions of the user's they may be message lists (TRL's
        conversational form, `runtime.hostwork.score_problems`), as may the prompts."""
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        start = time.perf_counter()
        n = len(completions)
        rows = list(columns) if columns is not None else [{} for _ in range(n)]
        # TRL passes every column but its `prompt` / `completion` ones
        names = sorted({k for r in rows for k in r} - RESERVED_COLUMNS)
        kwargs = {"prompts": list(prompts) if prompts is not None else [""] * n,
                  "completions": list(completions),
                  **{k: [r.get(k) for r in rows] for k in names}}
        kwargs.setdefault("answer", list(references))
        ids = list(row_ids) if row_ids is not None else [str(i) for i in range(n)]
        rewards_B = np.zeros(n, np.float32)
        sums, counts, failed, scores = {}, {}, {}, {}
        timeouts = errors = 0
        for fn in self.fns.fns:
            shared = {} if self.trainer_state is None else {"trainer_state": self.trainer_state}
            got = scores[fn.name] = self.fns.score(fn, kwargs, ids, shared)
            self.failures.check(fn, got, None if self.trainer_state is None
                                else int(self.trainer_state["step"]))
            rewards_B += np.float32(fn.weight) * got.values_B
            sums[fn.name] = float(got.values_B[got.applicable_B].sum())
            counts[fn.name] = int(got.applicable_B.sum())
            failed[fn.name] = int(got.failed_B.sum())
            timeouts += got.timeouts
            errors += got.errors
        if self.settings.kind == RewardKind.python:
            return RewardBatch(rewards_B, python_correct(self.settings, rewards_B, scores),
                               np.ones(n, bool), timeouts, errors,
                               time.perf_counter() - start, sums, counts, failed)
        correct_B = rewards_B >= 1.0
        formatted_B = np.array([is_formatted(self.settings.kind, t) for t in completions], bool)
        # A correct answer scores 1; a well-formed wrong one only the small format bonus, so
        # the reward stays in [0, 1] and its mean reads as (roughly) accuracy.
        fmt = np.float32(self.settings.format_reward)
        rewards_B = np.where(correct_B, np.float32(1.0), fmt * formatted_B).astype(np.float32)
        return RewardBatch(rewards_B, correct_B, formatted_B, timeouts, errors,
                           time.perf_counter() - start)

    def close(self) -> None:
        """Stop the worker processes, if any were started."""
        self.fns.close()

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Score a batch of completions: correctness plus format bonus, on a pool of worker processes.

A scorer with `workers` > 1 spreads the work over that many worker processes (one per core of
the host it runs on, as the caller decides): math-verify checks always run in workers (they
need a time limit, see `boxed`), GSM8K verdicts in workers once a batch is large enough to
pay for the hand-over (POOL_MIN_PER_WORKER), otherwise in this process.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from compiler.sections import WorkloadConfig
from compiler.vocab import RewardKind
from locojax.rewards.boxed import MAX_ANSWER_CHARS, BoxedVerifier, quick_match
from locojax.rewards.extract import last_boxed
from locojax.rewards.gsm8k import gsm8k_verdict
from locojax.rewards.python_fns import PythonRewards

_WORKLOAD = WorkloadConfig()
"""The schema's workload defaults, which `RewardSettings` takes (each default written once)."""


@dataclass(frozen=True)
class RewardSettings:
    """What the scorer needs from the workload."""

    kind: RewardKind = _WORKLOAD.reward
    """Final-answer match (`gsm8k`) or math-verify equivalence of `\\boxed{}` (`boxed`)."""
    format_reward: float = _WORKLOAD.format_reward
    """Bonus for a well-formed answer, whatever its value."""
    timeout_s: float = _WORKLOAD.reward_timeout_s
    """Time limit of one math-verify check, or of one reward function's call on one batch;
    a timeout scores 0."""
    reward_fns: dict[str, str] = field(default_factory=dict)
    """With kind `python`: name -> `<file.py>:<function>` or `<module>:<function>`."""
    reward_weights: dict[str, float] = field(default_factory=dict)
    """Name -> weight in the reward (1 when not given)."""


@dataclass(frozen=True)
class RewardBatch:
    """Rewards of B completions and what went into them."""

    rewards_B: np.ndarray
    """float32: 1 if correct, else `format_reward` if formatted, else 0."""
    correct_B: np.ndarray
    """bool: the final answer matches the reference."""
    formatted_B: np.ndarray
    """bool: the answer is well formed (`#### n` or a closed `\\boxed{}`)."""
    timeouts: int
    """math-verify checks stopped at the time limit (scored wrong)."""
    errors: int
    """math-verify checks whose worker process died (scored wrong)."""
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

        return cls(rewards_B=np.concatenate([p.rewards_B for p in parts]),
                   correct_B=np.concatenate([p.correct_B for p in parts]),
                   formatted_B=np.concatenate([p.formatted_B for p in parts]),
                   timeouts=sum(p.timeouts for p in parts), errors=sum(p.errors for p in parts),
                   seconds=sum(p.seconds for p in parts), fn_sums=summed("fn_sums"),
                   fn_counts=summed("fn_counts"), fn_failed=summed("fn_failed"))


POOL_MIN_PER_WORKER = 256
"""GSM8K completions per worker below which a batch is scored in this process: a verdict takes
~0.03-0.13 ms, about what sending the text to a worker and back costs."""


def _chunks(items: Sequence, k: int) -> list[Sequence]:
    """`items` in at most k contiguous chunks of near-equal size (none empty)."""
    k = max(min(k, len(items)), 1)
    bounds = [len(items) * i // k for i in range(k + 1)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


class Scorer:
    """Turns (completion, reference answer) pairs into rewards; close() stops its workers."""

    def __init__(self, settings: RewardSettings, workers: int = 1) -> None:
        RewardKind(settings.kind)  # ValueError on an unknown kind, rather than a silent default
        self.settings = settings
        self.workers = max(int(workers), 1)
        """Worker processes the scorer may use (math-verify always uses at least one)."""
        self._verifiers: list[BoxedVerifier] = []
        self._threads: ThreadPoolExecutor | None = None
        self._python: PythonRewards | None = None
        if settings.kind == RewardKind.python:
            self._python = PythonRewards(settings.reward_fns, settings.reward_weights,
                                         settings.timeout_s)

    def _pool(self, k: int) -> tuple[list[BoxedVerifier], ThreadPoolExecutor]:
        """k started-on-demand workers and threads to wait on them."""
        while len(self._verifiers) < k:
            self._verifiers.append(BoxedVerifier(self.settings.timeout_s))
        if self._threads is None:
            self._threads = ThreadPoolExecutor(self.workers, thread_name_prefix="scorer")
        return self._verifiers[:k], self._threads

    def score_batch(self, completions: Sequence[str], references: Sequence[str],
                    prompts: Sequence[str] | None = None,
                    columns: Sequence[dict] | None = None,
                    row_ids: Sequence[str] | None = None) -> RewardBatch:
        """Score completions[i] against references[i] (a GSM8K number or a boxed answer); with
        kind `python`, call the user's functions on the prompts, completions and columns."""
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        if self._python is not None:
            return self._score_python(completions, references, prompts, columns, row_ids)
        start = time.perf_counter()
        n = len(completions)
        correct_B = np.zeros(n, dtype=bool)
        formatted_B = np.zeros(n, dtype=bool)
        timeouts = errors = 0
        if self.settings.kind == RewardKind.gsm8k:
            for i, (ok, fmt) in enumerate(self._gsm8k(list(zip(completions, references,
                                                               strict=True)))):
                correct_B[i], formatted_B[i] = ok, fmt
        else:
            timeouts, errors = self._score_boxed(completions, references, correct_B, formatted_B)
        # A correct answer scores 1; a well-formed wrong one only the small format bonus, so
        # the reward stays in [0, 1] and its mean reads as (roughly) accuracy.
        fmt = np.float32(self.settings.format_reward)
        rewards_B = np.where(correct_B, np.float32(1.0), fmt * formatted_B).astype(np.float32)
        seconds = time.perf_counter() - start
        return RewardBatch(rewards_B, correct_B, formatted_B, timeouts, errors, seconds)

    def _score_python(self, completions, references, prompts, columns, row_ids) -> RewardBatch:
        """The weighted sum of the user's functions; each one's sums and failures counted."""
        assert self._python is not None
        start = time.perf_counter()
        n = len(completions)
        rows = list(columns) if columns is not None else [{} for _ in range(n)]
        names = sorted({k for r in rows for k in r} - {"prompts", "completions"})
        kwargs = {"prompts": list(prompts) if prompts is not None else [""] * n,
                  "completions": list(completions),
                  **{k: [r.get(k) for r in rows] for k in names}}
        kwargs.setdefault("answer", list(references))
        ids = list(row_ids) if row_ids is not None else [str(i) for i in range(n)]
        rewards_B = np.zeros(n, np.float32)
        sums, counts, failed = {}, {}, {}
        timeouts = errors = 0
        for name in self._python.fns:
            got = self._python.score(name, kwargs, ids)
            rewards_B += np.float32(self._python.weights[name]) * got.values_B
            sums[name] = float(got.values_B[got.applicable_B].sum())
            counts[name] = int(got.applicable_B.sum())
            failed[name] = n if got.failed else 0
            timeouts += got.failed == "timeout"
            errors += got.failed == "error"
        correct_B = rewards_B > 0
        seconds = time.perf_counter() - start
        return RewardBatch(rewards_B, correct_B, np.ones(n, bool), int(timeouts), int(errors),
                           seconds, sums, counts, failed)

    def _gsm8k(self, pairs: list[tuple[str, str]]) -> list[tuple[bool, bool]]:
        """Verdicts in this process, or spread over the workers for a large batch."""
        k = min(self.workers, len(pairs) // POOL_MIN_PER_WORKER)
        if k < 2:
            return [gsm8k_verdict(text, ref) for text, ref in pairs]
        verifiers, threads = self._pool(k)
        chunks = _chunks(pairs, k)
        results = list(threads.map(lambda v, c: v.gsm8k_many(c), verifiers, chunks))
        return [v for chunk, got in zip(chunks, results, strict=True)
                for v in (got if got is not None else [gsm8k_verdict(*p) for p in chunk])]

    def _score_boxed(self, completions, references, correct_B, formatted_B) -> tuple[int, int]:
        # A group's G samples often box the same answer: check each distinct pair once.
        pending: dict[tuple[str, str], list[int]] = {}
        for i, (text, ref) in enumerate(zip(completions, references, strict=True)):
            pred = last_boxed(text)
            formatted_B[i] = pred is not None
            if pred is None or len(pred) > MAX_ANSWER_CHARS:
                continue
            if quick_match(pred, ref):
                correct_B[i] = True
            else:
                pending.setdefault((pred, ref), []).append(i)
        if not pending:
            return 0, 0
        pairs = list(pending)
        chunks = _chunks(pairs, self.workers)
        verifiers, threads = self._pool(len(chunks))
        results = list(threads.map(lambda v, c: v.verify_many(c), verifiers, chunks))
        equal = [e for r in results for e in r.equal]
        for pair, ok in zip(pairs, equal, strict=True):
            correct_B[pending[pair]] = ok
        return sum(r.timeouts for r in results), sum(r.errors for r in results)

    def close(self) -> None:
        """Stop the worker processes, if any were started."""
        for v in self._verifiers:
            v.close()
        self._verifiers = []
        if self._python is not None:
            self._python.close()
        if self._threads is not None:
            self._threads.shutdown()
            self._threads = None

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

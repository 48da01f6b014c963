"""Score a batch of completions on the host that sampled them: correctness plus format bonus."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from compiler.vocab import RewardKind
from locojax.rewards.boxed import MAX_ANSWER_CHARS, BoxedVerifier, quick_match
from locojax.rewards.extract import last_boxed
from locojax.rewards.gsm8k import gsm8k_verdict


@dataclass(frozen=True)
class RewardSettings:
    """What the scorer needs from the workload."""

    kind: RewardKind = RewardKind.gsm8k
    """Final-answer match (`gsm8k`) or math-verify equivalence of `\\boxed{}` (`boxed`)."""
    format_reward: float = 0.0
    """Bonus for a well-formed answer, whatever its value."""
    timeout_s: float = 1.0
    """Time limit of one math-verify check; a timeout scores 0."""


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


class Scorer:
    """Turns (completion, reference answer) pairs into rewards; close() stops its worker."""

    def __init__(self, settings: RewardSettings) -> None:
        RewardKind(settings.kind)  # ValueError on an unknown kind, rather than a silent default
        self.settings = settings
        self._verifier: BoxedVerifier | None = None

    def score_batch(self, completions: Sequence[str], references: Sequence[str]) -> RewardBatch:
        """Score completions[i] against references[i] (a GSM8K number or a boxed answer)."""
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        start = time.perf_counter()
        n = len(completions)
        correct_B = np.zeros(n, dtype=bool)
        formatted_B = np.zeros(n, dtype=bool)
        timeouts = errors = 0
        if self.settings.kind == RewardKind.gsm8k:
            for i, (text, ref) in enumerate(zip(completions, references, strict=True)):
                correct_B[i], formatted_B[i] = gsm8k_verdict(text, ref)
        else:
            timeouts, errors = self._score_boxed(completions, references, correct_B, formatted_B)
        # A correct answer scores 1; a well-formed wrong one only the small format bonus, so
        # the reward stays in [0, 1] and its mean reads as (roughly) accuracy.
        fmt = np.float32(self.settings.format_reward)
        rewards_B = np.where(correct_B, np.float32(1.0), fmt * formatted_B).astype(np.float32)
        seconds = time.perf_counter() - start
        return RewardBatch(rewards_B, correct_B, formatted_B, timeouts, errors, seconds)

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
        if self._verifier is None:
            self._verifier = BoxedVerifier(self.settings.timeout_s)
        pairs = list(pending)
        result = self._verifier.verify_many(pairs)
        for pair, equal in zip(pairs, result.equal, strict=True):
            correct_B[pending[pair]] = equal
        return result.timeouts, result.errors

    def close(self) -> None:
        """Stop the math-verify worker, if one was started."""
        if self._verifier is not None:
            self._verifier.close()
            self._verifier = None

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Scores of k completions per prompt: pass@1, pass@k (the unbiased estimator), maj@k.

    per prompt: n completions, their correct flags and texts
        ──pass_at_k(n, c, k)──> 1 - C(n-c, k) / C(n, k)        (Chen et al. 2021, eq. 1)
        ──majority_correct──> whether the most frequent answer is a correct one
    every prompt ──summarize_samples──> EvalSummary: pass@1, pass@k, maj@k, mean length,
                                        truncation rate (`as_row` names them `pass@<k>` ...)

k = 1 is the greedy completion (`runtime.episode`), whose score is `greedy_accuracy`
(`eval_greedy_accuracy` in the metrics row); k > 1 are samples at the sampling temperature,
whose `pass@1` is the mean over prompts of c/k, beside `pass@<k>` and `maj@<k>`. So pass@1
always means the sampled estimate, in the run's rows and in `locojax-eval`'s summary.

Pure numpy and the reward package's answer extraction: `locojax-eval` and the in-run
evaluation (`run.eval_samples`) both reduce their per-prompt samples here. With correctness
unknown (a user's reward without `workload.correct` or `correct_threshold`: the correct flags
are None) pass@1, pass@k and maj@k are left out of the summary and of the metrics row.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from locojax.rewards.extract import hash_answer, last_boxed, last_number, normalize_number


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with `c` correct among `n` samples (k <= n):
    1 - C(n-c, k)/C(n, k), computed as a product so that large n does not overflow."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c={c} <= n={n} and 1 <= k={k} <= n")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def answer_key(text: str) -> str | None:
    """The final answer a completion commits to (boxed, `####`, or its last number), for the
    majority vote; None when it gives none."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    raw = hash_answer(text) or last_number(text)
    return None if raw is None else (normalize_number(raw) or raw.strip())


def majority_correct(texts: Sequence[str], correct: Sequence[bool]) -> bool:
    """maj@k of one prompt: whether the most frequent answer among `texts` (ties: the first
    to appear) is one a correct completion gave; False when no completion gives an answer."""
    keys = [answer_key(t) for t in texts]
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return False
    top = max(counts.values())
    winner = next(k for k in keys if k is not None and counts[k] == top)
    return any(ok for k, ok in zip(keys, correct, strict=True) if k == winner)


@dataclass(frozen=True)
class EvalSummary:
    """The scores of an evaluation of `prompts` prompts, `samples` completions each."""

    prompts: int
    samples: int
    pass1: float | None
    """Mean fraction of correct completions per prompt: pass@1 estimated from all k samples,
    or for k = 1 the greedy completion's accuracy; None, as the two below, when correctness is
    unknown."""
    pass_k: float | None
    """Mean unbiased pass@k (k = samples)."""
    maj_k: float | None
    """Fraction of prompts whose majority answer is correct."""
    mean_length: float
    """Mean completion length in tokens."""
    truncation_rate: float
    """Fraction of completions that ran out of tokens before a stop token."""

    def as_row(self) -> dict[str, float | int]:
        """The summary JSON: `greedy_accuracy` for k = 1, else `pass@1`, `pass@<k>`,
        `maj@<k>` (absent when correctness is unknown), lengths and counts."""
        scores = score_fields(self.samples, self.pass1, self.pass_k, self.maj_k)
        return {**{key: v for key, v in scores.items() if v is not None},
                "mean_length": self.mean_length, "truncation_rate": self.truncation_rate,
                "prompts": self.prompts, "samples": self.samples}


def correct_scores(correct_PxK: np.ndarray, texts: Sequence[Sequence[str]]) -> tuple[float, ...]:
    """(pass@1, pass@k, maj@k) of P > 0 prompts with K completions each."""
    k = correct_PxK.shape[1]
    return (float(correct_PxK.mean()),
            float(np.mean([pass_at_k(k, int(c), k) for c in correct_PxK.sum(axis=1)])),
            float(np.mean([majority_correct(t, c)
                           for t, c in zip(texts, correct_PxK, strict=True)])))


def summarize_samples(correct_PxK: np.ndarray | None, texts: Sequence[Sequence[str]],
                      lengths_PxK: np.ndarray, truncated_PxK: np.ndarray) -> EvalSummary:
    """The summary of P prompts with K completions each (correct flags, None when
    correctness is unknown; texts, lengths, and whether each ran out of tokens)."""
    p, k = np.shape(lengths_PxK)
    if p == 0:
        empty = None if correct_PxK is None else math.nan
        return EvalSummary(0, k, empty, empty, empty, math.nan, math.nan)
    scores = ((None,) * 3 if correct_PxK is None
              else correct_scores(np.asarray(correct_PxK, dtype=bool), texts))
    return EvalSummary(p, k, *scores, mean_length=float(np.mean(lengths_PxK)),
                       truncation_rate=float(np.mean(np.asarray(truncated_PxK, dtype=bool))))


@dataclass(frozen=True)
class EvalSamples:
    """K completions of each of P prompts, scored (one host's share, or all of them)."""

    correct_PxK: np.ndarray | None
    """bool; None when correctness is unknown (`RewardBatch.correct_B` None)."""
    texts: list[list[str]]
    lengths_PxK: np.ndarray
    truncated_PxK: np.ndarray

    @property
    def samples(self) -> int:
        return int(np.shape(self.lengths_PxK)[1])

    def summary(self) -> EvalSummary:
        return summarize_samples(self.correct_PxK, self.texts, self.lengths_PxK,
                                 self.truncated_PxK)

    def sums(self) -> np.ndarray:
        """[sum of pass@1, of pass@k, of maj@k over prompts, prompts]: what hosts add up;
        the three sums are NaN when correctness is unknown, so that their total is too."""
        p = len(self.texts)
        if self.correct_PxK is None:
            return np.array([math.nan] * 3 + [p], np.float64)
        if not p:
            return np.zeros(4)
        s = self.summary()
        return np.array([s.pass1 * p, s.pass_k * p, s.maj_k * p, p], np.float64)


def correct_grid(correct_B: np.ndarray | None, prompts: int, k: int) -> np.ndarray | None:
    """The first prompts x k of `correct_B` as a P x K grid (k per prompt, in order); None
    (unknown) stays None."""
    if correct_B is None:
        return None
    return np.asarray(correct_B[:prompts * k], bool).reshape(prompts, k)


def score_fields(samples: int, pass1: float | None, pass_k: float | None,
                 maj_k: float | None) -> dict[str, float | None]:
    """The scores' names for k = `samples`: {"greedy_accuracy"} for the greedy completion
    (k = 1), {"pass@1", "pass@<k>", "maj@<k>"} for k samples."""
    if samples == 1:
        return {"greedy_accuracy": pass1}
    return {"pass@1": pass1, f"pass@{samples}": pass_k, f"maj@{samples}": maj_k}


def eval_fields(sums: np.ndarray, samples: int) -> dict[str, float]:
    """The metrics row's evaluation fields from every host's summed `sums`:
    `eval_greedy_accuracy` for k = 1, else `eval_pass@1`, `eval_pass@k`, `eval_maj@k`; none
    when correctness is unknown (NaN sums)."""
    if np.isnan(sums[:3]).any():
        return {}
    p = max(float(sums[3]), 1.0)
    scores = score_fields(samples, *(float(s / p) for s in sums[:3]))
    return {f"eval_{key}": v for key, v in scores.items()}

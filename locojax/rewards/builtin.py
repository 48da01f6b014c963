"""The built-in rewards, as functions of the user's interface (`workload.reward=gsm8k|boxed`).

Each is `fn(prompts=[...], completions=[...], answer=[...], **columns) -> list[float]`: 1.0
for a correct final answer, else 0.0. The scorer calls them as it calls a user's function (in
its worker processes, under `workload.reward_timeout_s`), one row per call so that a check
that hangs costs that row only, and adds the format bonus (`workload.format_reward`) to a
wrong but well-formed answer (`is_formatted`). A user may name them in `workload.reward_fns`
(`locojax.rewards.builtin:gsm8k`).

math-verify is imported on first use, in the worker: its own timeouts use `signal.alarm` and
a thread cannot be stopped (sympy can spend minutes inside one C call, `9^{9^{9^9}}`), so the
time limit is the worker's: a row past it kills the worker, which is replaced.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from compiler.vocab import RewardKind
from locojax.rewards.extract import hash_answer, last_boxed, normalize_number
from locojax.rewards.gsm8k import gsm8k_verdict

POOL_MIN_PER_WORKER = 256
"""GSM8K completions per worker below which a batch goes to fewer workers: a verdict takes
~0.03-0.13 ms, about what handing the text to one more worker costs."""
MAX_ANSWER_CHARS = 1000
"""Boxed answers longer than this are scored wrong without a parse (MATH500's longest: 73)."""
_SPACE_RE = re.compile(r"\s+")


def gsm8k(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str],
          **columns) -> list[float]:
    """1.0 where the `#### n` answer (else the last number) equals the reference number."""
    return [float(gsm8k_verdict(text, ref)[0]) for text, ref in
            zip(completions, answer, strict=True)]


def boxed(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str],
          **columns) -> list[float]:
    """1.0 where the last `\\boxed{}` is equivalent to the reference (math-verify)."""
    out = []
    for text, ref in zip(completions, answer, strict=True):
        pred = last_boxed(text)
        ok = (pred is not None and len(pred) <= MAX_ANSWER_CHARS
              and (quick_match(pred, ref) or equivalent(pred, ref)))
        out.append(float(ok))
    return out


def warm_up() -> None:
    """math-verify's imports and first parse (~8 s on a busy core), before a worker's first
    timed call."""
    equivalent("0.5", "\\frac{1}{2}")


def _hash_number(text: str) -> str | None:
    """The normalised number after `####`, or None."""
    tagged = hash_answer(text)
    return normalize_number(tagged) if tagged is not None else None


def _boxed_answer(text: str) -> str | None:
    """The last non-empty `\\boxed{}` content, or None."""
    return last_boxed(text) or None


def _has_boxed(text: str) -> bool:
    """A closed `\\boxed{}`, empty or not."""
    return last_boxed(text) is not None


@dataclass(frozen=True)
class Builtin:
    """Everything one built-in reward kind decides, in one place: a new kind is one function
    and one entry of `BUILTINS` (and its `RewardKind` value and cost key:
    `compiler.cost.phases.SCORE_COST_KEY`)."""

    fn: Callable[..., list[float]]
    """The verdicts (1.0 correct, else 0.0), in the user's function interface."""
    reference: Callable[[str], str | None]
    """The final answer a reference solution states in the kind's format, or None (the row
    is skipped)."""
    formatted: Callable[[str], bool]
    """Whether a completion states an answer in the kind's format: what earns the format
    bonus when the answer is wrong."""
    marker: str
    """How the kind's answers are written, for the data's skipped-row line."""
    per_row: bool = True
    """One row per call, so a check that hangs costs that row only."""
    min_rows_per_worker: int = 1
    """Rows per worker below which a batch goes to fewer workers."""
    limit_per_row: bool = False
    """`workload.reward_timeout_s` per row rather than per call."""
    preload: tuple[str, ...] = ()
    """What a worker runs before its first call (seconds, not timed)."""


BUILTINS = {
    RewardKind.gsm8k: Builtin(gsm8k, _hash_number, lambda t: _hash_number(t) is not None,
                              "'####' number", per_row=False,
                              min_rows_per_worker=POOL_MIN_PER_WORKER,
                              limit_per_row=True),
    RewardKind.boxed: Builtin(boxed, _boxed_answer, _has_boxed, "\\boxed{}",
                              preload=(f"warm:{__name__}:warm_up",)),
}
"""Each built-in reward kind (`workload.reward`; `python` is the user's functions)."""


def builtin(kind: RewardKind) -> Builtin:
    """The record of a built-in kind; ValueError naming the kind for any other."""
    found = BUILTINS.get(RewardKind(kind))
    if found is None:
        raise ValueError(f"workload.reward={kind}: not a built-in reward kind "
                         f"({', '.join(BUILTINS)})")
    return found


def spec_of(kind: RewardKind) -> str:
    """`<module>:<function>` of a built-in kind, as `workload.reward_fns` would name it."""
    return f"{__name__}:{builtin(kind).fn.__name__}"


def preload_of(spec: str) -> tuple[str, ...]:
    """What a worker imports before running `spec` (a built-in's heavy imports; else none)."""
    return next((b.preload for k, b in BUILTINS.items() if spec_of(k) == spec), ())


def is_formatted(kind: RewardKind, text: str) -> bool:
    """Whether a completion states its answer in the kind's format (`#### n`, a closed
    `\\boxed{}`): what earns the format bonus when the answer is wrong."""
    return builtin(kind).formatted(text)


def quick_match(pred: str, gold: str) -> bool:
    """Whether two answers are equal as written, ignoring whitespace (skips a parse)."""
    return _SPACE_RE.sub("", pred) == _SPACE_RE.sub("", gold)


@functools.lru_cache(maxsize=4096)
def _parsed(answer: str) -> list:
    from math_verify import parse

    return parse("\\boxed{" + answer + "}", parsing_timeout=None)


@functools.lru_cache(maxsize=16384)
def equivalent(pred: str, gold: str) -> bool:
    """math-verify's equivalence of two answers (any failure to compare: False); cached, as a
    group's samples often box the same answer."""
    from math_verify import verify

    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.ERROR)  # it warns that we disabled its timeouts
    try:
        return bool(verify(_parsed(gold), _parsed(pred), timeout_seconds=None))
    except Exception:  # any failure to compare scores as wrong
        return False

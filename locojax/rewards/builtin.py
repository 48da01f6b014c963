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
from collections.abc import Sequence

from compiler.vocab import RewardKind
from locojax.rewards.extract import hash_answer, last_boxed, normalize_number
from locojax.rewards.gsm8k import gsm8k_verdict

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


BUILTIN = {RewardKind.gsm8k: gsm8k, RewardKind.boxed: boxed}
"""The function of each built-in reward kind."""


def warm_up() -> None:
    """math-verify's imports and first parse (~8 s on a busy core), before a worker's first
    timed call."""
    equivalent("0.5", "\\frac{1}{2}")


PRELOAD = {RewardKind.boxed: (f"warm:{__name__}:warm_up",)}
"""What a worker runs before its first call to a built-in (seconds, not timed)."""


def spec_of(kind: RewardKind) -> str:
    """`<module>:<function>` of a built-in kind, as `workload.reward_fns` would name it."""
    return f"{__name__}:{BUILTIN[RewardKind(kind)].__name__}"


def preload_of(spec: str) -> tuple[str, ...]:
    """What a worker imports before running `spec` (a built-in's heavy imports; else none)."""
    return next((PRELOAD.get(k, ()) for k in BUILTIN if spec_of(k) == spec), ())


def is_formatted(kind: RewardKind, text: str) -> bool:
    """Whether a completion states its answer in the kind's format (`#### n`, a closed
    `\\boxed{}`): what earns the format bonus when the answer is wrong."""
    if kind == RewardKind.boxed:
        return last_boxed(text) is not None
    tagged = hash_answer(text)
    return tagged is not None and normalize_number(tagged) is not None


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

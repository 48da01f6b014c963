"""Rewards computed on the host that sampled: functions of one interface (the built-in GSM8K
answer match and boxed-LaTeX equivalence, or the user's), run in the scorer's workers."""

from locojax.rewards.builtin import equivalent, is_formatted
from locojax.rewards.extract import hash_answer, last_boxed, last_number, normalize_number
from locojax.rewards.gsm8k import gsm8k_verdict
from locojax.rewards.python_fns import RewardFnError, fn_digest
from locojax.rewards.runner import RewardFn, RewardFns
from locojax.rewards.scorer import RewardBatch, RewardSettings, Scorer

__all__ = [
    "RewardBatch",
    "RewardFn",
    "RewardFnError",
    "RewardFns",
    "RewardSettings",
    "Scorer",
    "equivalent",
    "fn_digest",
    "gsm8k_verdict",
    "hash_answer",
    "is_formatted",
    "last_boxed",
    "last_number",
    "normalize_number",
]

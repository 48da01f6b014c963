"""Rewards computed on the host that sampled: GSM8K answer match, boxed-LaTeX equivalence,
or reward functions of the user's."""

from locojax.rewards.boxed import BoxedVerifier, VerifyResult
from locojax.rewards.extract import hash_answer, last_boxed, last_number, normalize_number
from locojax.rewards.gsm8k import gsm8k_verdict
from locojax.rewards.python_fns import PythonRewards, RewardFnError, fn_digest
from locojax.rewards.scorer import RewardBatch, RewardSettings, Scorer

__all__ = [
    "BoxedVerifier",
    "PythonRewards",
    "RewardBatch",
    "RewardFnError",
    "RewardSettings",
    "Scorer",
    "VerifyResult",
    "fn_digest",
    "gsm8k_verdict",
    "hash_answer",
    "last_boxed",
    "last_number",
    "normalize_number",
]

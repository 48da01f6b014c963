"""Rewards computed on the host that sampled: GSM8K answer match and boxed-LaTeX equivalence."""

from locojax.rewards.boxed import BoxedVerifier, VerifyResult
from locojax.rewards.extract import hash_answer, last_boxed, last_number, normalize_number
from locojax.rewards.gsm8k import gsm8k_verdict
from locojax.rewards.scorer import RewardBatch, RewardSettings, Scorer

__all__ = [
    "BoxedVerifier",
    "RewardBatch",
    "RewardSettings",
    "Scorer",
    "VerifyResult",
    "gsm8k_verdict",
    "hash_answer",
    "last_boxed",
    "last_number",
    "normalize_number",
]

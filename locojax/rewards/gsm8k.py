"""GSM8K final-answer match: `#### n` (else the last number), normalised, compared exactly."""

from __future__ import annotations

from locojax.rewards.extract import hash_answer, last_number, normalize_number


def gsm8k_verdict(completion: str, reference: str) -> tuple[bool, bool]:
    """(correct, formatted) of a completion against a reference number string.

    Formatted means a `####` followed by a number; without one the last number counts.
    """
    tagged = hash_answer(completion)
    tagged_norm = normalize_number(tagged) if tagged is not None else None
    if tagged_norm is not None:
        pred = tagged_norm
    else:
        raw = last_number(completion)
        pred = normalize_number(raw) if raw is not None else None
    gold = normalize_number(reference)
    correct = pred is not None and gold is not None and pred == gold
    return correct, tagged_norm is not None

"""Rewards on real data: GSM8K answers, MATH500 boxed answers through math-verify, time limits."""

import json
import random
import threading
from pathlib import Path

import numpy as np
import pytest
from paths import DATA, needs_data

from compiler.vocab import RewardKind
from locojax.rewards import (
    RewardSettings,
    Scorer,
    equivalent,
    gsm8k_verdict,
    hash_answer,
    last_boxed,
    normalize_number,
)
from locojax.rewards.builtin import POOL_MIN_PER_WORKER


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


@pytest.fixture(scope="module")
def boxed_scorer():
    with Scorer(RewardSettings(RewardKind.boxed, format_reward=0.1, timeout_s=2.0)) as scorer:
        yield scorer


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("1,234", "1234"),
        (" $5.00 ", "5"),
        ("+7", "7"),
        ("18.", "18"),
        ("0.50", "0.5"),
        ("-0.0", "0"),
        ("- 3", "-3"),
        ("007", "7"),
        (".5", "0.5"),
        ("123456789012345678901234567890123", "123456789012345678901234567890123"),
        ("1e5", None),
        ("abc", None),
        ("", None),
        ("-", None),
    ],
)
def test_normalize_number(raw, expected):
    assert normalize_number(raw) == expected


def test_extractors():
    assert hash_answer("a #### 5 then #### 1,000.") == "1,000."
    assert hash_answer("#### no number") is None
    assert last_boxed(r"\boxed{1} and \boxed{\frac{a}{b^{2}}} end") == r"\frac{a}{b^{2}}"
    assert last_boxed(r"\boxed{1} then \boxed{2") == "1"  # the unclosed box does not count
    assert last_boxed(r"\boxed{\{1,2\}}") == r"\{1,2\}"
    assert last_boxed("no box {}") is None


@pytest.mark.parametrize(
    "completion, reference, correct, formatted",
    [
        ("so 3+5=8\n#### 8", "8", True, True),
        ("#### $1,000.00", "1000", True, True),
        ("It costs 18 dollars.", "18", True, False),  # last number, unformatted
        ("#### 17 and later 18", "18", False, True),  # the tagged answer wins
        ("####", "18", False, False),
        ("", "0", False, False),
        ("#### -3", "3", False, True),
        ("#### 8", "not a number", False, True),
        ("#### 1e999999", "1", False, False),  # scientific notation is not read as 1
        ("about 2.5E+3 or 7", "7", True, False),
    ],
)
def test_gsm8k_verdict(completion, reference, correct, formatted):
    assert gsm8k_verdict(completion, reference) == (correct, formatted)


@needs_data
@pytest.mark.parametrize("split", ["train", "test"])
def test_every_gsm8k_reference_solution_scores_full_marks(split):
    rows = _rows(DATA / "gsm8k" / f"{split}.jsonl")
    answers = [normalize_number(r["answer"].rsplit("####", 1)[1]) for r in rows]
    scorer = Scorer(RewardSettings(RewardKind.gsm8k, format_reward=0.1))
    batch = scorer.score_batch([r["answer"] for r in rows], answers)
    assert batch.correct_B.all() and batch.formatted_B.all() and batch.timeouts == 0
    np.testing.assert_allclose(batch.rewards_B, 1.0)
    assert batch.rewards_B.dtype == np.float32
    # Paired with the next row's answer almost nothing matches (a few answers coincide).
    shifted = scorer.score_batch([r["answer"] for r in rows], answers[1:] + answers[:1])
    assert shifted.correct_B.mean() < 0.02
    np.testing.assert_allclose(shifted.rewards_B[~shifted.correct_B], 0.1)


@needs_data
def test_math500_boxed_answers_verify_against_the_answer_field():
    rows = _rows(DATA / "math500" / "test.jsonl")
    pairs = [(last_boxed(r["solution"]), r["answer"]) for r in rows]
    assert all(p is not None for p, _ in pairs)
    # Through math-verify itself (the built-in function would take the string-equal shortcut).
    same = [equivalent(p, g) for p, g in pairs]
    shifted = [equivalent(p, pairs[i - 1][1]) for i, (p, _) in enumerate(pairs)]
    assert np.mean(same) >= 0.99  # measured: 500/500
    assert np.mean(shifted) < 0.02  # measured: 3/500, all truly equal answers


@pytest.mark.parametrize(
    "pred, gold, equal",
    [
        ("0.5", r"\frac{1}{2}", True),
        (r"\frac34", r"\dfrac{3}{4}", True),
        (r"\sqrt{8}", r"2\sqrt{2}", True),
        ("(x+1)^2", "x^2+2x+1", True),
        (r"\{2,1\}", r"\{1,2\}", True),
        ("3.0", "3", True),
        ("0.51", r"\frac{1}{2}", False),
        ("(2,1)", "(1,2)", False),
        ("-3", "3", False),
    ],
)
def test_boxed_equivalence(boxed_scorer, pred, gold, equal):
    batch = boxed_scorer.score_batch([f"The answer is $\\boxed{{{pred}}}$."], [gold])
    assert batch.correct_B[0] == equal and batch.formatted_B[0]
    assert batch.rewards_B[0] == pytest.approx(1.0 if equal else 0.1)


def test_a_check_past_the_time_limit_scores_zero_and_the_worker_recovers():
    # 2 s: far below the minutes of the slow check, far above an ordinary one on a busy machine.
    with Scorer(RewardSettings(RewardKind.boxed, timeout_s=2.0)) as scorer:
        scorer.score_batch([r"\boxed{1}"], ["2"])  # the worker is up before the slow check
        # sympy evaluates 9^(9^(9^9)) in one C call: minutes without the limit. The limit is
        # what reports the timeout, and the next check needs the restarted worker.
        batch = scorer.score_batch([r"\boxed{9^{9^{9^9}}}", r"\boxed{1/2}"], ["2", "0.5"])
        assert batch.timeouts == 1 and batch.correct_B.tolist() == [False, True]
        assert scorer.score_batch([r"\boxed{2/4}"], ["0.5"]).correct_B[0]


def test_a_dead_worker_is_replaced_between_batches(boxed_scorer):
    boxed_scorer.score_batch([r"\boxed{1/3}"], ["0.5"])
    worker = boxed_scorer.fns.workers[0].process
    worker.kill()  # as the OOM killer would
    worker.wait()
    batch = boxed_scorer.score_batch([r"\boxed{1/3}", r"\boxed{2/4}"], ["0.5", "0.5"])
    assert batch.correct_B.tolist() == [False, True] and batch.errors == batch.timeouts == 0


def test_boxed_scoring_works_off_the_main_thread(boxed_scorer):
    # math-verify's own signal-based timeouts raise in threads; ours do not use signals.
    result = {}
    completions = [r"\boxed{\frac{2}{4}}", r"\boxed{7}", "no box"]
    thread = threading.Thread(
        target=lambda: result.update(b=boxed_scorer.score_batch(completions, ["0.5"] * 3))
    )
    thread.start()
    thread.join(timeout=60)
    assert result["b"].correct_B.tolist() == [True, False, False]
    assert result["b"].formatted_B.tolist() == [True, True, False]


def test_group_duplicates_are_checked_once_and_scored_alike(boxed_scorer):
    rng = random.Random(0)
    completions = [
        rng.choice([r"\boxed{0.25}", r"\boxed{1/4}", r"\boxed{4}", "4"]) for _ in range(64)
    ]
    batch = boxed_scorer.score_batch(completions, [r"\frac{1}{4}"] * 64)
    expected = [c in (r"\boxed{0.25}", r"\boxed{1/4}") for c in completions]
    assert batch.correct_B.tolist() == expected


def test_a_pool_of_workers_scores_as_one_process_does():
    rng = random.Random(1)
    answers = [r"\boxed{0.25}", r"\boxed{1/4}", r"\boxed{4}", r"\boxed{2/8}", "4"]
    completions = [rng.choice(answers) + " " * rng.randrange(3) for _ in range(40)]
    refs = [r"\frac{1}{4}"] * 40
    settings = RewardSettings(RewardKind.boxed, format_reward=0.1, timeout_s=5.0)
    with Scorer(settings) as one, Scorer(settings, workers=3) as pool:
        a, b = one.score_batch(completions, refs), pool.score_batch(completions, refs)
        assert len(pool.fns.workers) == 3  # the rows went to three processes
    np.testing.assert_array_equal(a.rewards_B, b.rewards_B)
    np.testing.assert_array_equal(a.formatted_B, b.formatted_B)


def test_a_large_gsm8k_batch_is_spread_over_the_pool():
    rng = random.Random(2)
    n = 2 * POOL_MIN_PER_WORKER
    completions = [f"so #### {rng.randrange(5)}" if rng.random() < 0.7 else
                   f"it is {rng.randrange(5)}" for _ in range(n)]
    refs = [str(rng.randrange(5)) for _ in range(n)]
    settings = RewardSettings(RewardKind.gsm8k, format_reward=0.1)
    with Scorer(settings) as one, Scorer(settings, workers=2) as pool:
        a, b = one.score_batch(completions, refs), pool.score_batch(completions, refs)
        assert len(pool.fns.workers) == 2 and len(one.fns.workers) == 1
    np.testing.assert_array_equal(a.rewards_B, b.rewards_B)
    np.testing.assert_array_equal(a.correct_B, b.correct_B)


def test_length_mismatch_is_a_caller_error():
    with pytest.raises(ValueError, match="2 completions but 1 references"):
        Scorer(RewardSettings()).score_batch(["a", "b"], ["1"])

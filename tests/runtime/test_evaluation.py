"""pass@k (Chen et al. 2021's unbiased estimator), maj@k and the evaluation summary, checked
against values computed by hand."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest

from locojax.runtime.evaluation import (
    answer_key,
    majority_correct,
    pass_at_k,
    summarize_samples,
)


@pytest.mark.parametrize(("n", "c", "k", "want"), [
    (4, 1, 2, 0.5),          # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (5, 2, 3, 0.9),          # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (4, 0, 4, 0.0),
    (4, 1, 4, 1.0),
    (4, 3, 1, 0.75),         # pass@1 is c/n
    (10, 2, 5, 1 - 56 / 252),  # C(8,5)=56, C(10,5)=252
])
def test_pass_at_k_by_hand(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


def test_pass_at_k_equals_binomials_and_no_overflow():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - comb(n - c, k) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    assert 0.0 < pass_at_k(2000, 1, 100) < 1.0


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(4, 5, 2)
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(4, 1, 5)


def test_answer_key_and_majority():
    assert answer_key("so \\boxed{12}") == "12"
    assert answer_key("... #### 1,000") == "1000"
    assert answer_key("no answer here") is None
    # "7" twice (wrong), "5" once (right): the majority is wrong
    assert not majority_correct(["7", "= 7", "5"], [False, False, True])
    # a tie goes to the first answer given
    assert majority_correct(["5", "7"], [True, False])
    assert not majority_correct(["none", "nothing"], [False, False])


def test_summary_of_a_fixed_set():
    texts = [["#### 3", "#### 3", "#### 4", "#### 3"],  # 3 right of 4, majority 3 (right)
             ["#### 9", "#### 8", "#### 8", "#### 1"],  # 1 right (9), majority 8 (wrong)
             ["x", "y", "z", "w"]]                      # none right, no answers
    correct = np.array([[1, 1, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0]], bool)
    lengths = np.array([[4, 4, 6, 2], [5, 5, 5, 5], [8, 8, 8, 8]])
    truncated = np.array([[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]], bool)
    s = summarize_samples(correct, texts, lengths, truncated)
    assert s.pass1 == pytest.approx((3 / 4 + 1 / 4 + 0) / 3)
    assert s.pass_k == pytest.approx(2 / 3)   # pass@4 with n = 4: any correct
    assert s.maj_k == pytest.approx(1 / 3)
    assert s.mean_length == pytest.approx(68 / 12)
    assert s.truncation_rate == pytest.approx(2 / 12)
    row = s.as_row()
    assert set(row) >= {"pass@1", "pass@4", "maj@4", "mean_length", "truncation_rate"}
    # one greedy completion a prompt: its accuracy, never named pass@1
    greedy = summarize_samples(correct[:, :1], [t[:1] for t in texts], lengths[:, :1],
                               truncated[:, :1]).as_row()
    assert greedy["greedy_accuracy"] == pytest.approx(2 / 3)
    assert not {"pass@1", "maj@1"} & set(greedy)

"""The built-in rewards as functions of the user's interface: the same scores as the scorer
gave before they were (a fixed set of completions, with and without the format bonus), and
the same functions named in `workload.reward_fns`."""

import json
from pathlib import Path

import numpy as np
import pytest

from compiler.vocab import RewardKind
from locojax.rewards import RewardSettings, Scorer
from locojax.rewards.builtin import boxed, gsm8k, spec_of

# Written by the scorer before the built-ins became functions (commit 7cccf9e): 60 GSM8K and
# 60 boxed completions, their rewards at format_reward 0 and 0.1, correct and formatted flags.
OLD = json.loads((Path(__file__).parents[1] / "fixtures" / "rewards" /
                  "old_scores.json").read_text())


@pytest.mark.parametrize("kind", ["gsm8k", "boxed"])
@pytest.mark.parametrize("bonus", [0.0, 0.1])
def test_the_builtin_functions_score_as_the_old_scorer(kind, bonus):
    completions, refs = zip(*OLD[kind]["pairs"], strict=True)
    settings = RewardSettings(RewardKind(kind), format_reward=bonus, timeout_s=5.0)
    with Scorer(settings) as scorer:
        got = scorer.score_batch(list(completions), list(refs))
    np.testing.assert_array_equal(got.rewards_B, np.float32(OLD[kind][f"rewards@{bonus}"]))
    assert got.correct_B.tolist() == OLD[kind]["correct"]
    assert got.formatted_B.tolist() == OLD[kind]["formatted"]
    assert 0 < sum(got.correct_B) < len(refs) and sum(got.formatted_B) > sum(got.correct_B)


@pytest.mark.parametrize(("kind", "fn"), [("gsm8k", gsm8k), ("boxed", boxed)])
def test_the_builtins_have_the_interface_and_run_as_user_functions(kind, fn):
    completions, refs = (list(x) for x in zip(*OLD[kind]["pairs"], strict=True))
    prompts = ["p"] * len(refs)
    direct = fn(prompts=prompts, completions=completions, answer=refs, extra=prompts)
    assert direct == [float(c) for c in OLD[kind]["correct"]]
    settings = RewardSettings(RewardKind.python, timeout_s=120.0,
                              reward_fns={"mine": spec_of(RewardKind(kind))})
    with Scorer(settings) as scorer:  # the user's path: one call on the whole batch
        got = scorer.score_batch(completions, refs, prompts)
    assert got.rewards_B.tolist() == direct and got.fn_counts == {"mine": len(refs)}


def test_every_reward_kind_has_its_record_and_its_cost_key():
    """A built-in kind is one record (`rewards.builtin.BUILTINS`: function, reference answer,
    format check, skipped-row marker, pooling, preload) and one cost key; a kind without them
    is refused, never scored as another (issue 37)."""
    from compiler.cost.phases import SCORE_COST_KEY
    from compiler.vocab import RewardKind
    from locojax.data import reference_answer
    from locojax.rewards.builtin import BUILTINS, builtin, is_formatted

    assert set(BUILTINS) == set(RewardKind) - {RewardKind.python}
    assert set(SCORE_COST_KEY) == set(RewardKind)
    with pytest.raises(ValueError, match="workload.reward=python: not a built-in reward kind"):
        builtin(RewardKind.python)
    assert reference_answer("so #### 1,234", "gsm8k") == "1234"
    assert reference_answer("it is \\boxed{\\frac{1}{2}}", "boxed") == "\\frac{1}{2}"
    assert reference_answer("it is \\boxed{}", "boxed") is None
    assert is_formatted(RewardKind.boxed, "\\boxed{}") and not is_formatted("gsm8k", "#### x")

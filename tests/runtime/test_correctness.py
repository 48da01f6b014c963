"""What counts as a correct answer with rewards of the user's (issue 40): `workload.correct`
names the function that decides it (its value >= `correct_threshold`, default 1), or
`correct_threshold` alone applies to the weighted sum; with neither, correctness is unknown
and accuracy, pass@1, pass@k and maj@k are absent from the metrics row, the in-run
evaluation's fields and `locojax-eval`'s summary, and the run says so once at start.

The pair scored here is examples/reverse's own (`exact` 1/0, `overlap` in [0, 1]) through
the real `Scorer`: with `reward > 0` as the verdict (before issue 40) pass@4 was 1 on every
prompt whatever the policy wrote."""

from __future__ import annotations

import numpy as np
import pytest
from paths import ROOT

from compiler import PlanError, compile_plan
from compiler.sections import WorkloadConfig
from compiler.vocab import RewardKind
from locojax.config.compose import compose_config
from locojax.eval.share import rows_of, samples_of
from locojax.rewards import RewardFnError, RewardSettings, Scorer
from locojax.rewards.scorer import UNJUDGED, unjudged_line
from locojax.runtime.evaluation import (
    EvalSamples,
    correct_grid,
    eval_fields,
    pass_at_k,
    summarize_samples,
)
from locojax.runtime.groups import GroupCounts
from locojax.runtime.hostwork import HostTimes
from locojax.runtime.observe.stats import reward_fields, stats_row

REWARDS = ROOT / "examples" / "reverse" / "rewards.py"
FNS = {"exact": f"{REWARDS}:exact", "overlap": f"{REWARDS}:overlap"}
WEIGHTS = {"exact": 1.0, "overlap": 2.0}
"""Reward = exact + 2 overlap: a near miss (3 of 4 digits) reaches 1.5 without `exact`."""
K = 4
TARGETS = ["4321"] * K + ["65"] * K
COMPLETIONS = ["4321", "4329", "1234", "4300",  # exact 1 0 0 0; overlap 1, 3/4, 0, 2/4
               "56", "66", "6", "75"]           # exact 0 0 0 0; overlap 0, 1/2, 1/2, 1/2
REWARDS_B = [3.0, 1.5, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
EXACT = [True, False, False, False, False, False, False, False]
SUM_AT_LEAST_1_5 = [True, True, False, False, False, False, False, False]


def _score(correct=None, threshold=None, fns=FNS, completions=COMPLETIONS, targets=TARGETS):
    settings = RewardSettings(kind=RewardKind.python, timeout_s=10.0, reward_fns=fns,
                              reward_weights={k: v for k, v in WEIGHTS.items() if k in fns},
                              correct=correct, correct_threshold=threshold)
    n = len(completions)
    with Scorer(settings) as scorer:
        return scorer.score_batch(completions, [""] * n, ["p"] * n,
                                  [{"target": t} for t in targets],
                                  [f"reverse/train/{i}" for i in range(n)])


@pytest.fixture(scope="module")
def by_exact():
    return _score(correct="exact")


@pytest.fixture(scope="module")
def by_sum():
    return _score(threshold=1.5)


@pytest.fixture(scope="module")
def unknown():
    return _score()


def _samples(correct_B) -> EvalSamples:
    n = len(COMPLETIONS) // K
    return EvalSamples(correct_grid(correct_B, n, K),
                       [COMPLETIONS[i * K:(i + 1) * K] for i in range(n)],
                       np.full((n, K), 3), np.zeros((n, K), bool))


def test_the_named_function_decides_correctness(by_exact):
    assert by_exact.rewards_B.tolist() == REWARDS_B  # the reward itself is unchanged
    assert by_exact.correct_B.tolist() == EXACT


def test_a_threshold_alone_applies_to_the_weighted_sum(by_sum):
    assert by_sum.rewards_B.tolist() == REWARDS_B
    assert by_sum.correct_B.tolist() == SUM_AT_LEAST_1_5


def test_neither_leaves_correctness_unknown(unknown):
    assert unknown.rewards_B.tolist() == REWARDS_B and unknown.correct_B is None


def test_a_row_the_function_gives_none_for_is_not_correct():
    # overlap is None for an empty target: not correct even at threshold 0, where 0 is
    batch = _score(correct="overlap", threshold=0.0, fns={"overlap": FNS["overlap"]},
                   completions=["12", "x"], targets=["", "9"])
    assert batch.correct_B.tolist() == [False, True]


def test_pass_at_k_and_maj_at_k_of_the_masks_by_hand(by_exact, by_sum, unknown):
    # by exact: prompt A 1 of 4 correct, prompt B none
    got = _samples(by_exact.correct_B).summary().as_row()
    assert got["pass@1"] == pytest.approx((1 / 4 + 0) / 2)
    assert got["pass@4"] == pytest.approx((1 + 0) / 2)
    assert got["maj@4"] == pytest.approx((1 + 0) / 2)  # every answer once: the first wins
    # by the sum: A 2 of 4 (pass@2 = 1 - C(2,2)/C(4,2) = 5/6), B none
    grid = correct_grid(by_sum.correct_B, 2, K)
    assert [pass_at_k(K, int(c), 2) for c in grid.sum(axis=1)] == pytest.approx([5 / 6, 0.0])
    got = _samples(by_sum.correct_B).summary().as_row()
    assert (got["pass@1"], got["pass@4"]) == pytest.approx(((2 / 4 + 0) / 2, 0.5))
    # unknown: no pass@ or maj@ keys at all (not 0, not NaN)
    got = _samples(unknown.correct_B).summary().as_row()
    assert not {"pass@1", "pass@4", "maj@4"} & set(got)
    assert got["prompts"] == 2 and got["samples"] == K and got["mean_length"] == 3.0
    # what `reward > 0` said before: 3 of 4 on both prompts, pass@4 = 1
    before = summarize_samples(correct_grid(unknown.rewards_B > 0, 2, K),
                               _samples(None).texts, np.full((2, K), 3), np.zeros((2, K)))
    assert before.pass_k == 1.0


def test_the_in_run_evaluation_fields(by_exact, unknown):
    known = _samples(by_exact.correct_B).sums()
    assert eval_fields(known + known, K) == pytest.approx(  # two hosts' sums
        {"eval_pass@1": 0.125, "eval_pass@4": 0.5, "eval_maj@4": 0.5})
    # k = 1 is the greedy completion: its accuracy has its own key, never pass@1
    assert eval_fields(known, 1) == pytest.approx({"eval_greedy_accuracy": 0.125})
    none = _samples(unknown.correct_B).sums()
    assert eval_fields(none, K) == {} and eval_fields(none, 1) == {}
    empty = EvalSamples(None, [], np.zeros((0, K), int), np.zeros((0, K), bool))
    assert eval_fields(none + empty.sums(), K) == {}  # a host without prompts


def test_locojax_eval_rows_carry_correct_only_when_known(by_exact, unknown):
    rows = rows_of(_samples(by_exact.correct_B), 0, 0)
    assert rows[0]["correct"] == EXACT[:K]
    assert samples_of(rows, K).correct_PxK.tolist() == [EXACT[:K], EXACT[K:]]
    rows = rows_of(_samples(unknown.correct_B), 0, 0)
    assert all("correct" not in r for r in rows) and samples_of(rows, K).correct_PxK is None


def _row(batch) -> dict:
    stats = stats_row(batch, np.full(len(batch.rewards_B), 3), 0,
                      {"rollout_s": 1.0, "reward_s": 0.1, "advantage_s": 0.1}, HostTimes(),
                      GroupCounts(2, 0, 0, 1, 0.0))
    return reward_fields(0, np.stack([stats, stats]), tuple(FNS))  # two hosts


def test_the_metrics_row_has_accuracy_only_when_known(by_exact, by_sum, unknown):
    assert _row(by_exact)["accuracy"] == pytest.approx(1 / 8)
    assert _row(by_sum)["accuracy"] == pytest.approx(2 / 8)
    row = _row(unknown)
    assert "accuracy" not in row and row["reward_mean"] == pytest.approx(sum(REWARDS_B) / 8)
    assert row["reward/exact"] == pytest.approx(1 / 8)


def test_the_scorer_refuses_a_verdict_it_cannot_give():
    with pytest.raises(RewardFnError, match="workload.correct=nope: no such function"):
        Scorer(RewardSettings(kind=RewardKind.python, reward_fns=FNS, correct="nope"))
    with pytest.raises(RewardFnError, match="workload.correct_threshold: set with "
                                            "workload.reward=gsm8k"):
        Scorer(RewardSettings(kind=RewardKind.gsm8k, correct_threshold=0.5))


def test_the_start_line_says_when_accuracy_is_not_reported(tmp_path, capsys):
    from locojax.runtime.rundir.provenance import announce

    python = WorkloadConfig(reward=RewardKind.python)
    assert unjudged_line(python) == UNJUDGED and "\n" not in UNJUDGED
    assert unjudged_line(WorkloadConfig(reward=RewardKind.python, correct="exact")) is None
    assert unjudged_line(WorkloadConfig(reward=RewardKind.python, correct_threshold=1.0)) is None
    assert unjudged_line(WorkloadConfig()) is None  # gsm8k judges itself
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
    announce(_plan(), tmp_path / "a")
    out = capsys.readouterr().out.splitlines()
    assert out.count(UNJUDGED) == 1 and out[-1] == UNJUDGED and out[0].startswith("weights:")
    announce(_plan("workload.correct=exact"), tmp_path / "b")
    assert UNJUDGED not in capsys.readouterr().out


def _plan(*overrides: str):
    return compile_plan(compose_config([
        "mesh=cpu", "+experiment=arith_co", "workload=custom",
        f"+workload.reward_fns.exact={FNS['exact']}", *overrides]))


def test_the_plan_carries_correct_to_the_scorer():
    from locojax.runtime.assemble import reward_settings

    settings = reward_settings(_plan("workload.correct=exact",
                                     "workload.correct_threshold=0.5").workload)
    assert (settings.correct, settings.correct_threshold) == ("exact", 0.5)


def _builtin_plan(*overrides: str):
    """arith_co's own gsm8k reward, which takes no reward functions."""
    return compile_plan(compose_config(["mesh=cpu", "+experiment=arith_co", *overrides]))


@pytest.mark.parametrize("overrides,plan", [
    (["workload.correct=nope"], _plan),  # no such function among workload.reward_fns
    (["workload.correct=exact"], _builtin_plan),  # gsm8k judges correctness itself
])
def test_a_correct_the_compiler_refuses_is_one_line_naming_the_key(overrides, plan):
    with pytest.raises(PlanError) as err:
        plan(*overrides)
    assert err.value.key == "workload.correct" and "\n" not in str(err.value)
    assert str(err.value).startswith(f"workload.correct={overrides[-1].split('=')[1]}: must be")


def test_a_threshold_with_a_builtin_reward_is_refused():
    with pytest.raises(PlanError) as err:
        _builtin_plan("workload.correct_threshold=0.5")
    assert err.value.key == "workload.correct_threshold"
    with pytest.raises(PlanError) as err:  # and so are reward functions, which it would ignore
        _plan("workload=arith")
    assert err.value.key == "workload.reward_fns" and "workload.reward=gsm8k" in str(err.value)

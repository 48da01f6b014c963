"""Issue 31 in the compiler: DA on lagged samples needs the behaviour weight; the cost model
drops the pi_old forward the trainer skips; the recipes' defaults (issue 40: dual clip, GSPO's
clip and aggregation with sequence ratios, LoRA's rate)."""

from pathlib import Path

import pytest
import yaml
from compiler_cases import make_config

from compiler import PlanError, compile_plan
from compiler.cost.phases import scoring_forwards
from compiler.sections import AlgorithmConfig
from compiler.vocab import LossAggregation, OldLogprobs, RolloutCorrection
from locojax.config.compose import compose_config
from locojax.runtime.assemble import grpo_settings

CONF = Path(__file__).resolve().parents[2] / "conf"
MESH = {"kind": "cpu", "hosts": 4, "devices_per_host": 2}
DA = {"mode": "disaggregated", "rollout_fraction": 0.75, "max_staleness": 1}
NONE = RolloutCorrection.none


def test_da_with_lag_and_no_correction_is_refused_in_one_line():
    off = make_config(mesh=MESH, placement=DA,
                      overrides={"algorithm": {"rollout_correction": NONE}})
    with pytest.raises(PlanError) as err:
        compile_plan(off)
    assert err.value.key == "algorithm.rollout_correction"
    assert err.value.rule_id == "stale_uncorrected"
    assert "\n" not in str(err.value) and "max_staleness=1" in str(err.value)
    # The default corrects; so do the engine's pi_old and synchronous DA.
    assert compile_plan(make_config(mesh=MESH, placement=DA)).algorithm.rollout_logp
    for fixed in ({"algorithm": {"rollout_correction": NONE,
                                 "old_logprobs": OldLogprobs.rollout}},):
        compile_plan(make_config(mesh=MESH, placement=DA, overrides=fixed))
    compile_plan(make_config(mesh=MESH, placement={**DA, "max_staleness": 0},
                             overrides={"algorithm": {"rollout_correction": NONE}}))


def test_cost_model_counts_the_pi_old_forward_only_where_it_runs():
    assert scoring_forwards(AlgorithmConfig()) == 0  # one update: pi_old is the current pi
    assert scoring_forwards(AlgorithmConfig(optimizer_steps_per_batch=4)) == 1
    assert scoring_forwards(AlgorithmConfig(optimizer_steps_per_batch=4,
                                            old_logprobs=OldLogprobs.rollout)) == 0
    assert scoring_forwards(AlgorithmConfig(optimizer_steps_per_batch=4, kl_coef=0.1)) == 2
    one = compile_plan(make_config(mesh=MESH))
    four = compile_plan(make_config(mesh=MESH,
                                    overrides={"algorithm": {"optimizer_steps_per_batch": 4}}))
    assert four.cost.co.train_s > one.cost.co.train_s  # the extra forward is charged


@pytest.mark.parametrize("name", ["gsm8k_co", "gsm8k_da", "numina_co", "numina_da"])
def test_field_recipes_take_several_updates_and_clip_higher(name):
    algorithm = yaml.safe_load((CONF / "experiment" / f"{name}.yaml").read_text())["algorithm"]
    assert algorithm["optimizer_steps_per_batch"] > 1 and algorithm["dual_clip"] == 3.0
    # The recipe plans at the paper's sizes up to 256 v7x chips (6 rows per trainer device
    # there: any mini-batches must divide them).
    for chips in (64, 256):
        plan = compile_plan(compose_config([f"+experiment={name}", "mesh=v7x",
                                            f"mesh.chips={chips}"]))
        assert (plan.algorithm.clip_eps, plan.algorithm.clip_eps_high) == (0.2, 0.28)
        assert plan.algorithm.dual_clip == 3.0
        assert plan.algorithm.optimizer_steps_per_batch == algorithm["optimizer_steps_per_batch"]


def test_workloads_with_answers_have_no_format_bonus():
    for name in ("gsm8k", "numina_cot"):
        assert yaml.safe_load((CONF / "workload" / f"{name}.yaml").read_text())[
            "format_reward"] == 0.0


@pytest.mark.parametrize("name", ["gsm8k_co", "arith_co"])
def test_sequence_ratios_take_gspo_clip_and_aggregation_unless_set(name):
    base = [f"+experiment={name}", "mesh=cpu", "algorithm.ratio_level=sequence"]
    gspo = compose_config(base).algorithm
    assert (gspo.clip_eps, gspo.clip_eps_high) == (3e-4, 4e-4)
    assert gspo.loss_aggregation == LossAggregation.sequence_mean
    own = compose_config([*base, "algorithm.clip_eps=0.1",
                          "algorithm.loss_aggregation=token_mean"]).algorithm
    assert (own.clip_eps, own.clip_eps_high, own.loss_aggregation) == (
        0.1, 4e-4, LossAggregation.token_mean)
    token = compose_config([f"+experiment={name}", "mesh=cpu"]).algorithm
    assert token.clip_eps == 0.2 and token.loss_aggregation == LossAggregation.token_mean


def test_lora_takes_three_times_the_full_rate_unless_set():
    base = ["+experiment=arith_co", "mesh=cpu"]
    full = compile_plan(compose_config(base)).algorithm
    lora = compile_plan(compose_config([*base, "algorithm.lora.rank=16"])).algorithm
    own = compile_plan(compose_config([*base, "algorithm.lora.rank=16",
                                       "algorithm.lora.learning_rate=1e-3"])).algorithm
    assert full.lora.learning_rate == 0.0 and full.rl_learning_rate == 5e-4
    assert lora.lora.learning_rate == pytest.approx(1.5e-3)  # the plan holds the rate used
    assert own.lora.learning_rate == 1e-3 and own.learning_rate == 5e-4
    for algorithm, rate in ((full, 5e-4), (lora, 1.5e-3), (own, 1e-3)):
        assert grpo_settings(algorithm, 8, 10).optimizer.learning_rate == pytest.approx(rate)

"""algorithm.lora.warmup=full changes the base, which DA's rollout hosts never receive: DA is
refused in one line, placement=auto falls back to CO, and arith_co warms the whole model."""

import pytest
from compiler_cases import make_config

from compiler import PlanError, compile_plan
from compiler.config import PlacementMode
from compiler.sections import LoraConfig
from compiler.vocab import LoraWarmup
from locojax.config.compose import compose_config

MESH = {"kind": "cpu", "hosts": 4, "devices_per_host": 2}
FULL = {"algorithm": {"sft_warmup_steps": 2,
                      "lora": LoraConfig(rank=4, warmup=LoraWarmup.full)}}


def test_da_with_a_whole_model_lora_warm_up_is_refused_in_one_line_auto_picks_co():
    with pytest.raises(PlanError) as err:
        compile_plan(make_config(mesh=MESH, placement={"mode": "disaggregated",
                                                       "rollout_fraction": 0.5},
                                 overrides=FULL))
    assert err.value.key == "algorithm.lora.warmup" and err.value.rule_id == "lora_warmup_da"
    assert "\n" not in str(err.value)
    auto = compile_plan(make_config(mesh=MESH, placement={"mode": "auto"}, overrides=FULL))
    assert auto.placement.mode == PlacementMode.colocated
    assert any("does not compile" in c.reason for c in auto.placement_candidates)


def test_the_default_warms_the_adapters_and_arith_co_the_whole_model():
    assert compose_config([]).algorithm.lora.warmup == LoraWarmup.adapters
    assert compose_config(["+experiment=arith_co"]).algorithm.lora.warmup == LoraWarmup.full
    assert compose_config(["+experiment=arith_da"]).algorithm.lora.warmup == LoraWarmup.adapters


def test_a_whole_model_warm_up_counts_full_fine_tunings_state():
    from compiler.cost.memory import train_state_bytes_per_param

    cfg = make_config(mesh=MESH, overrides=FULL)
    adapters = make_config(mesh=MESH, overrides={"algorithm": {
        "sft_warmup_steps": 2, "lora": LoraConfig(rank=4)}})
    assert train_state_bytes_per_param(cfg.model, cfg.algorithm) == 16  # fp32 master + 3
    assert train_state_bytes_per_param(adapters.model, adapters.algorithm) == 4  # the base

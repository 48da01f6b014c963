"""Partition and sharding passes: role host sets, meshes, specs, and the errors they raise."""

import dataclasses

import pytest
from compiler_cases import make_config

from compiler import PlanError, compile_plan
from compiler.axes import MeshAxis
from compiler.params import param_table
from compiler.passes.partition import AUTO_FRACTIONS, candidate_placements
from compiler.pipeline import compile_placement, predicted_step_s

CPU = {"kind": "cpu", "hosts": 4, "devices_per_host": 2}
DA = {"mode": "disaggregated", "rollout_fraction": 0.75, "max_staleness": 1}


def _v7x(chips, model="qwen3_0_6b", workload="gsm8k", **kw):
    return make_config(model=model, workload=workload, hardware="v7x",
                       mesh={"kind": "tpu", "chips": chips}, **kw)


def test_colocated_every_host_has_both_roles():
    plan = compile_plan(make_config(mesh=CPU))
    assert plan.partitions.rollout_hosts == plan.partitions.trainer_hosts == (0, 1, 2, 3)
    assert plan.partitions.rollout_devices == plan.partitions.trainer_devices == 8


def test_disaggregated_first_hosts_roll_out():
    plan = compile_plan(make_config(mesh=CPU, placement=DA))
    assert plan.partitions.rollout_hosts == (0, 1, 2)
    assert plan.partitions.trainer_hosts == (3,)
    assert (plan.partitions.rollout_devices, plan.partitions.trainer_devices) == (6, 2)


@pytest.mark.parametrize("fraction,hosts,want", [(0.5, 2, 1), (0.75, 4, 3), (0.3, 5, 2),
                                                 (0.5, 3, 2), (0.1, 5, 1)])
def test_rollout_hosts_round_half_up(fraction, hosts, want):
    cfg = make_config(mesh={"kind": "cpu", "hosts": hosts, "devices_per_host": 1},
                      placement={**DA, "rollout_fraction": fraction},
                      overrides={"workload": {"prompts_per_step": want * (hosts - want)}})
    assert len(compile_plan(cfg).partitions.rollout_hosts) == want


@pytest.mark.parametrize("fraction,hosts", [(0.75, 2), (0.1, 4), (0.0, 4), (1.0, 4)])
def test_a_role_without_hosts_is_rejected(fraction, hosts):
    cfg = make_config(mesh={"kind": "cpu", "hosts": hosts, "devices_per_host": 1},
                      placement={**DA, "rollout_fraction": fraction})
    with pytest.raises(PlanError) as err:
        compile_plan(cfg)
    assert err.value.key == "placement.rollout_fraction"
    assert err.value.rule_id in ("role_without_host", "fraction_range")


def test_single_controller_rejects_disaggregated():
    with pytest.raises(PlanError) as err:
        compile_plan(make_config(mesh=CPU, placement=DA, controller="single"))
    assert err.value.key == "controller" and err.value.value == "single"


@pytest.mark.parametrize("workload,chips", [("gsm8k", 64), ("numina_cot", 256)])
def test_auto_placement_picks_the_cheapest_candidate(workload, chips):
    cfg = _v7x(chips, workload=workload, placement={"mode": "auto", "max_staleness": 1})
    plan = compile_plan(cfg)
    assert plan.placement.requested == "auto"
    topo = plan.topology
    candidates = candidate_placements(cfg.placement, cfg.controller, topo)
    assert candidates[0].mode == "colocated" and len(candidates) == 1 + len(AUTO_FRACTIONS)
    table = param_table(cfg.model)
    times = [predicted_step_s(compile_placement(cfg, table, topo, c)) for c in candidates]
    assert predicted_step_s(plan) == min(times)


def test_auto_placement_with_the_single_controller_is_colocated():
    plan = compile_plan(make_config(mesh=CPU, placement={"mode": "auto"}, controller="single"))
    assert plan.placement.mode == "colocated"


def test_numina_da_on_256_v7x_chips():
    plan = compile_plan(_v7x(256, workload="numina_cot", placement=DA))
    parts = plan.partitions
    assert plan.topology.hosts == 64
    assert len(parts.rollout_hosts) == 48 and len(parts.trainer_hosts) == 16
    assert not set(parts.rollout_hosts) & set(parts.trainer_hosts)
    assert {s.dst for r in plan.transfer.rounds for s in r} == set(parts.rollout_hosts)


def test_train_specs_shard_embed_over_fsdp():
    plan = compile_plan(_v7x(64))
    train = plan.sharding.train
    assert train.mesh == {MeshAxis("data"): 16, MeshAxis("fsdp"): 8}
    assert plan.sharding.fsdp_hosts == 1
    fsdp = MeshAxis("fsdp")
    assert train.specs["embed/embedding"] == (None, fsdp)
    assert train.specs["layers/mlp/down_proj"] == (None, None, fsdp)
    assert train.specs["final_norm/scale"] == (None,)
    assert set(train.specs) == {p.name for p in param_table(plan.model.config)}


def test_rollout_specs_shard_heads_mlp_vocab_over_tensor():
    plan = compile_plan(make_config(model="qwen3_8b", workload="gsm8k", hardware="v7x",
                               mesh={"kind": "tpu", "chips": 64, "rollout_tensor_parallel": 4}))
    rollout, tensor = plan.sharding.rollout, MeshAxis("tensor")
    assert rollout.mesh == {MeshAxis("replica"): 2, tensor: 4}
    assert rollout.specs["layers/attn/q_proj"] == (None, None, tensor, None)
    assert rollout.specs["layers/attn/k_proj"] == (None, None, tensor, None)
    assert rollout.specs["layers/mlp/gate_proj"] == (None, None, tensor)
    assert rollout.specs["embed/embedding"] == (tensor, None)
    assert rollout.specs["lm_head/kernel"] == (None, tensor)


def test_fsdp_axis_that_does_not_divide_hidden_names_devices_per_host():
    cfg = make_config(mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 3},
                      overrides={"workload": {"prompts_per_step": 3}})
    with pytest.raises(PlanError) as err:
        compile_plan(cfg)
    assert str(err.value) == ("mesh.devices_per_host=3: model.hidden=256 is not divisible by "
                              "the fsdp axis of 3 devices")


def test_tensor_axis_that_does_not_divide_heads_names_rollout_tensor_parallel():
    cfg = make_config(mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 8,
                            "rollout_tensor_parallel": 8})
    with pytest.raises(PlanError) as err:
        compile_plan(cfg)
    assert err.value.key == "mesh.rollout_tensor_parallel" and err.value.value == 8
    assert "model.num_heads=4 is not divisible by the tensor axis of 8 devices" in str(err.value)


def test_tensor_parallel_must_fit_the_hosts():
    cfg = make_config(mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 4,
                            "rollout_tensor_parallel": 3})
    with pytest.raises(PlanError) as err:
        compile_plan(cfg)
    assert err.value.rule_id == "tensor_layout"


def test_big_model_shards_over_several_hosts():
    plan = compile_plan(_v7x(512, model="llama3_405b", workload="numina_cot"))
    s = plan.sharding
    # 16 hosts hold the state; a step of one row per micro-batch (gradient accumulator, two
    # gathered layers, 126 layers of saved inputs) needs the gradients split 32 ways.
    assert s.fsdp_hosts == 32 and s.data_replicas == 4
    state = s.train.bytes_per_device
    assert state <= 0.75 * plan.topology.device_memory_bytes
    assert s.rollout_hosts_per_replica > 1
    assert s.rollout_groups * s.rollout_hosts_per_replica == 128


def test_model_too_big_for_the_trainers_names_model():
    with pytest.raises(PlanError) as err:
        compile_plan(_v7x(8, model="llama3_405b"))
    assert err.value.key == "model" and err.value.rule_id == "train_memory"
    assert "B/param" in str(err.value)


def test_rollout_tensor_parallelism_never_spans_hosts_for_a_model_the_runtime_runs():
    """Every runtime builds its rollout mesh from one host's devices: a Qwen3 plan asking for
    more is one keyed line; a plan-only family keeps the cross-host layout for inspection."""
    cfg = _v7x(8)
    cfg = dataclasses.replace(cfg, mesh=dataclasses.replace(cfg.mesh, rollout_tensor_parallel=16))
    with pytest.raises(PlanError) as err:
        compile_plan(cfg)
    assert err.value.key == "mesh.rollout_tensor_parallel"
    assert "rolls out host-locally" in str(err.value)
    plan = compile_plan(_v7x(128, model="llama3_405b"))
    assert plan.sharding.rollout.mesh["tensor"] > plan.topology.devices_per_host

"""The cost model under LoRA: the network term reduces the adapters' gradient only (the frozen
base has none, its FSDP gathers stay), DA moves the adapters, and `placement=auto` ranks
placements with those terms."""

import dataclasses

import pytest
from compiler_cases import make_config

from compiler import compile_plan
from compiler.config import PlacementMode
from compiler.cost import flops, memory
from compiler.cost import phases as ph
from compiler.cost.estimate import CostLayout, estimate


def _lora(cfg, rank=16):
    lora = dataclasses.replace(cfg.algorithm.lora, rank=rank)
    return dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, lora=lora))


def _layout(hosts, per_host, fsdp, rollout=None, trainer=None, rounds=()):
    trainer_hosts = trainer if trainer is not None else hosts
    return CostLayout(
        hosts=hosts, devices_per_host=per_host, chips=hosts * per_host,
        rollout_hosts=rollout if rollout is not None else hosts, trainer_hosts=trainer_hosts,
        fsdp_devices=fsdp, data_replicas=trainer_hosts * per_host // fsdp,
        rollout_tensor_parallel=1, transfer_round_bytes=tuple(rounds),
        transfer_link="none" if rollout is None else "dcn")


def test_lora_network_gathers_the_base_and_all_reduces_the_adapters_only():
    # 4 hosts x 8 GPUs: FSDP 8 inside a host (NVLink), 4 data replicas over DCN.
    cfg = make_config(model="qwen3_8b", workload="gsm8k", hardware="h100",
                      mesh={"kind": "gpu", "chips": 32})
    lora = _lora(cfg)
    full, lo = estimate(cfg, _layout(4, 8, fsdp=8)).co, estimate(lora, _layout(4, 8, 8)).co
    hw, c = cfg.hardware, cfg.hardware.cost
    ici = hw.ici_bytes_per_s * c.network_efficiency
    dcn = hw.dcn_bytes_per_s * c.network_efficiency
    lat, layers, weights = c.collective_latency_s, cfg.model.num_layers, flops.param_bytes(cfg.model)
    micro, scoring = lo.micro_batches, ph.scoring_forwards(cfg.algorithm)
    # Gathers for forward, backward and each scoring forward per micro-batch (no gradient
    # scatter: the base is frozen).
    # remat=block recomputes each block's forward in the backward: its weights once more.
    blocks = ph.block_bytes(cfg.model)
    assert blocks == weights - 2 * cfg.model.vocab * cfg.model.hidden * 2  # untied, bf16
    gathers = (2 + scoring) * micro * (weights * 7 / 8 / ici + layers * 7 * lat) \
        + micro * (blocks * 7 / 8 / ici + layers * 7 * lat)
    # The adapters' fp32 gradient, replicated on all 32 trainer devices, all-reduced each
    # micro-batch over the slowest link among them (DCN).
    adapter_grad = memory.adapter_elements(cfg.model, lora.algorithm) * 4
    reduce = micro * (2 * 31 / 32 * adapter_grad / dcn + layers * 2 * 31 * lat)
    assert lo.network_s == pytest.approx(gathers + reduce)
    # Full fine-tuning also reduces the gradient every micro-batch. With data replicas on
    # other hosts the compiler all-reduces it within the FSDP group (the blocks' in bf16, the
    # head table's in fp32), then the blocks' shard over the 4 replicas and the lookup
    # table's fp32 gradient over all 32 devices (docs/aot.md).
    f_micro, table = full.micro_batches, cfg.model.vocab * cfg.model.hidden * 4
    f_fsdp = f_micro * (((2 + scoring) * weights + blocks) * 7 / 8
                        + 2 * 7 / 8 * (blocks + table)) / ici \
        + (4 + scoring) * f_micro * layers * 7 * lat
    f_data = f_micro * ((2 * 3 / 4 * blocks / 8 + 2 * 31 / 32 * table) / dcn
                        + layers * 2 * 3 * lat)
    assert full.network_s == pytest.approx(f_fsdp + f_data)
    assert lo.network_s < full.network_s


def test_lora_without_fsdp_still_all_reduces_the_adapters_over_the_data_replicas():
    cfg = make_config(model="qwen3_0_6b", workload="gsm8k", hardware="h100",
                      mesh={"kind": "gpu", "chips": 8})
    lora = _lora(cfg, rank=64)
    one = estimate(lora, _layout(1, 8, fsdp=8)).co   # FSDP 8, no data replicas
    data = estimate(lora, _layout(1, 8, fsdp=1)).co  # 8 replicas, no FSDP
    assert one.network_s > 0
    # Without FSDP no gathers: what is left is the adapters' fp32 gradient all-reduced over
    # the 8 replicas (NVLink) each micro-batch, below full fine-tuning's whole-model one.
    hw, c = cfg.hardware, cfg.hardware.cost
    ici, lat = hw.ici_bytes_per_s * c.network_efficiency, c.collective_latency_s
    adapter_grad = memory.adapter_elements(cfg.model, lora.algorithm) * 4
    assert data.network_s == pytest.approx(data.micro_batches * (
        2 * 7 / 8 * adapter_grad / ici + cfg.model.num_layers * 2 * 7 * lat))
    assert data.network_s < estimate(cfg, _layout(1, 8, fsdp=1)).co.network_s


def test_da_estimated_from_a_co_layout_sends_the_adapters_only():
    cfg = make_config(model="qwen3_8b", workload="gsm8k", hardware="h100",
                      mesh={"kind": "gpu", "chips": 32})
    lora = _lora(cfg)
    full_da, lo_da = estimate(cfg, _layout(4, 8, 8)).da, estimate(lora, _layout(4, 8, 8)).da
    adapter = memory.adapter_elements(cfg.model, lora.algorithm) * 2  # bf16 on the wire
    ratio = adapter / flops.param_bytes(cfg.model)
    lat = cfg.hardware.cost.collective_latency_s
    rounds = 1  # one 8-device FSDP group per host: one slice, one round for two rollout hosts
    assert lo_da.transfer_s - rounds * lat == pytest.approx(
        (full_da.transfer_s - rounds * lat) * ratio)


def test_auto_placement_ranks_candidates_with_the_lora_terms():
    cfg = make_config(model="qwen3_8b", workload="gsm8k", hardware="v7x",
                      mesh={"kind": "tpu", "chips": 64},
                      placement={"mode": "auto", "rollout_fraction": 0.5})
    lora = _lora(cfg)
    full_plan, lora_plan = compile_plan(cfg), compile_plan(lora)
    for plan, conf in ((full_plan, cfg), (lora_plan, lora)):
        for cand in plan.placement_candidates:
            if not cand.step_s:
                continue
            mode = PlacementMode.colocated if cand.mode == PlacementMode.colocated else (
                PlacementMode.disaggregated)
            one = dataclasses.replace(conf, placement=dataclasses.replace(
                conf.placement, mode=mode, rollout_fraction=cand.rollout_fraction))
            own = compile_plan(one)
            assert cand.step_s == pytest.approx(own.own_cost.step_s)
    da = [c for c in lora_plan.placement_candidates
          if c.mode == PlacementMode.disaggregated and c.step_s]
    full_da = {c.rollout_fraction: c.step_s for c in full_plan.placement_candidates
               if c.mode == PlacementMode.disaggregated and c.step_s}
    assert da and all(c.step_s < full_da[c.rollout_fraction] for c in da)


def test_lora_train_flops_leave_out_the_frozen_base_weight_gradients():
    # Full fine-tuning: 3 x forward. LoRA: the base's backward computes activation gradients
    # only (one matmul forward less), the adapters cost 6 x their count per token.
    cfg = make_config(model="qwen3_8b", workload="gsm8k", hardware="h100",
                      mesh={"kind": "gpu", "chips": 32})
    model, L = cfg.model, 1024
    adapters = memory.adapter_elements(model, _lora(cfg).algorithm)
    assert adapters > 0 and memory.adapter_elements(model, cfg.algorithm) == 0
    full = flops.train_flops(model, L)
    assert full == 3 * flops.forward_flops(model, L)
    lora = flops.train_flops(model, L, adapters)
    assert lora == pytest.approx(full - 2 * flops.matmul_params(model) * L + 6 * adapters * L)
    assert 0.6 < lora / full < 0.7  # the matmuls dominate at 1,024 tokens
    # The cost model's train phase charges the same difference.
    full_s = estimate(cfg, _layout(4, 8, fsdp=8)).co
    lora_s = estimate(_lora(cfg), _layout(4, 8, fsdp=8)).co
    assert lora_s.train_s < full_s.train_s


def test_training_charges_the_head_on_the_response_columns_only():
    """The trainer runs the output head on the T response columns of an L-token row: full
    fine-tuning saves its 3 forwards' worth on the L - T prompt columns, LoRA (frozen head:
    no weight gradient) 2; a prefill runs it on its last token."""
    cfg = make_config(model="qwen3_0_6b", workload="gsm8k", hardware="v7x",
                      mesh={"kind": "tpu", "chips": 8})
    model, L, T = cfg.model, 1024, 768
    head = 2 * model.vocab * model.hidden
    adapters = memory.adapter_elements(model, _lora(cfg).algorithm)
    assert flops.forward_flops(model, L, head_len=T) == pytest.approx(
        flops.forward_flops(model, L) - head * (L - T))
    assert flops.train_flops(model, L, head_len=T) == pytest.approx(
        flops.train_flops(model, L) - 3 * head * (L - T))
    assert flops.train_flops(model, L, adapters, head_len=T) == pytest.approx(
        flops.train_flops(model, L, adapters) - 2 * head * (L - T))
    assert flops.prefill_flops(model, L) == pytest.approx(
        flops.forward_flops(model, L) - head * (L - 1))

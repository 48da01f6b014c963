"""Cost model: FLOP/byte counts by hand, documented formulas, mode rules, JSON round trip."""

import dataclasses
from math import ceil

import pytest
from compiler_cases import entry, make_config

from compiler import compile_plan, from_data, to_data
from compiler.cost import flops, memory
from compiler.cost import phases as ph
from compiler.cost.estimate import CostLayout, estimate, estimate_plan
from compiler.cost.flops import (
    decode_token_flops,
    forward_flops,
    kv_bytes_per_token,
    matmul_params,
    param_bytes,
)
from compiler.hardware import min_chips_for_training, valid_chip_count
from compiler.params import param_count
from compiler.plan import CostEstimate

CALIBRATION = {"model": "qwen3_0_6b", "workload": "gsm8k", "hardware": "v7x",
               "mesh": {"kind": "tpu", "chips": 8}, "controller": "single",
               "placement": {"mode": "colocated", "rollout_fraction": 1.0, "max_staleness": 0}}


def layout(hosts, per_host, chips=None, fsdp=1, tp=1, rollout=None, trainer=None,
           rounds=(), link="none"):
    """A CostLayout; CO unless `rollout`/`trainer` split the hosts."""
    trainer_hosts = trainer if trainer is not None else hosts
    return CostLayout(
        hosts=hosts, devices_per_host=per_host, chips=chips or hosts * per_host,
        rollout_hosts=rollout if rollout is not None else hosts, trainer_hosts=trainer_hosts,
        fsdp_devices=fsdp, data_replicas=trainer_hosts * per_host // fsdp,
        rollout_tensor_parallel=tp, transfer_round_bytes=tuple(rounds), transfer_link=link)


def test_flop_and_byte_counts_by_hand():
    tiny, big = entry("model", "tiny"), entry("model", "qwen3_14b")
    # Tied: the embedding is the output matmul; untied: the input embedding is only a gather.
    assert matmul_params(tiny) == param_count(tiny)
    assert matmul_params(big) == param_count(big) - 151936 * 5120
    # 4 layers x 4 heads x head_dim 64: causal attention over 10 tokens is 2*4*4*64*10*11.
    assert forward_flops(tiny, 10) == 2 * param_count(tiny) * 10 + 2 * 4 * 4 * 64 * 10 * 11
    assert decode_token_flops(tiny, 100) == 2 * param_count(tiny) + 4 * 4 * 4 * 64 * 100
    q06 = entry("model", "qwen3_0_6b")
    assert kv_bytes_per_token(q06) == 28 * 2 * 8 * 128 * 2  # layers x K,V x kv heads x dim x bf16
    assert param_bytes(q06) == 2 * param_count(q06)
    assert param_bytes(tiny) == 4 * param_count(tiny)  # float32 entry


@pytest.mark.parametrize("model,hardware", [("llama3_405b", "v7x"), ("llama3_70b", "h100"),
                                            ("qwen3_0_6b", "v7x"), ("qwen3_8b", "h100")])
def test_min_chips_for_training_is_the_smallest_valid_fit(model, hardware):
    m, hw = entry("model", model), entry("hardware", hardware)
    state = param_count(m) * 16  # 16 B/param: bf16 param + grad, fp32 m, v, master
    chips = min_chips_for_training(m, hw)
    per_chip = hw.hbm_bytes * memory.TRAIN_STATE_FRACTION
    assert state <= chips * per_chip
    if hw.slice_topology == "torus3d":
        assert chips in (4, 8, 16, 32) or chips % 64 == 0
    else:
        assert chips % hw.chips_per_host == 0 or chips in (1, 2, 4)
    assert not any(valid_chip_count(hw, c) and state <= c * per_chip for c in range(1, chips))
    expected = {("llama3_405b", "v7x"): 64, ("llama3_70b", "h100"): 24,
                ("qwen3_0_6b", "v7x"): 4, ("qwen3_8b", "h100"): 4}
    assert chips == expected[(model, hardware)]


def test_rollout_and_train_follow_the_documented_formulas():
    cfg = make_config(model="tiny", workload="arith", hardware="cpu",
                      mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 1})
    hw, c, model = cfg.hardware, cfg.hardware.cost, cfg.model
    co = estimate(cfg, layout(1, 1)).co
    n, lp, lr = 24 * 8, 16, 12
    weights = 4 * param_count(model)
    bw, rate = hw.hbm_bytes_per_s * c.decode_efficiency, hw.peak_flops_fp32 * c.prefill_efficiency
    ctx = lp + (lr + 1) / 2
    step = max((weights + n * ctx * kv_bytes_per_token(model)) / bw,
               n * decode_token_flops(model, ctx) / rate)
    head = 2 * model.vocab * model.hidden  # logits of the last prompt token only
    prefill = max(n * (forward_flops(model, lp) - head * (lp - 1)) / rate, weights / bw)
    assert co.rollout_waves == 1
    assert co.rollout_s == pytest.approx(prefill + lr * step, rel=1e-12)
    # forward + backward (3 forwards), the head on the lr response columns only; one update
    # per batch runs no pi_old forward
    layers_and_head = forward_flops(model, lp + lr) - head * lp
    train = n * 3 * layers_and_head / (hw.peak_flops_fp32 * c.train_efficiency)
    assert co.train_s == pytest.approx(train, rel=1e-12)
    # Host work: 2 cores for the one host's detokenising and scoring, rows in one process.
    assert co.detok_s == pytest.approx(n / 2 * lr * c.detok_s_per_token)
    assert co.score_s == pytest.approx(n / 2 * c.score_gsm8k_s_per_sample)
    assert co.reward_s == co.detok_s + co.score_s
    g = cfg.workload.group_size  # each prompt encoded once, rows per sample
    assert co.batch_s == pytest.approx(n / g * lp * c.encode_s_per_token
                                       + n * (lp + lr) * c.batch_s_per_token)
    assert co.dispatch_s == pytest.approx(c.dispatches_per_step * c.local_dispatch_s)
    assert co.gather_s == 0.0  # a local controller gathers nothing to itself
    assert co.host_s == pytest.approx(co.reward_s + co.batch_s + co.dispatch_s)
    assert co.network_s == 0.0 and co.transfer_s == 0.0  # one device: nothing to move


def test_kv_cache_that_does_not_fit_decodes_in_waves():
    cfg = make_config(model="qwen3_0_6b", workload="gsm8k", hardware="cpu",
                      mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 1},
                      overrides={"hardware": {"hbm_bytes": 40e9}})
    co = estimate(cfg, layout(1, 1)).co
    state = param_count(cfg.model) * 16
    room = 40e9 * memory.ROLLOUT_FRACTION - param_bytes(cfg.model) - state
    per_wave = int(room // (kv_bytes_per_token(cfg.model) * (256 + 768)))
    assert co.feasible and co.rollout_waves == ceil(3072 / per_wave) > 1


def test_single_controller_pays_per_host_dispatch_and_central_host_work():
    cfg = make_config(**CALIBRATION)
    cost, c = estimate(cfg, layout(2, 8, chips=8, fsdp=8)), cfg.hardware.cost
    assert cost.single.dispatch_s == pytest.approx(2 * c.dispatches_per_step * c.dispatch_s)
    assert cost.co.dispatch_s == pytest.approx(c.dispatches_per_step * c.local_dispatch_s)
    # Every sample is detokenised, scored and batched on the controller's host: twice a
    # local host's share, on the same number of cores.
    for kind in ("reward_s", "detok_s", "score_s", "batch_s"):
        assert getattr(cost.single, kind) == pytest.approx(2 * getattr(cost.co, kind))
    assert cost.single.gather_s > 0 == cost.co.gather_s  # completions in, rows out
    assert cost.single.network_s == cost.co.network_s
    assert cost.single.compute_s == cost.co.compute_s
    assert cost.single.step_s > cost.co.step_s


def test_controller_traffic_counts_completions_in_and_rows_out():
    cfg = make_config(**CALIBRATION)
    n, lp, lr = 384 * 8, 256, 768
    want = n * ((4 * (lp + lr) + 5 * lr) + 14 * (lp + lr) + 4 * lp / 8)
    assert ph.controller_bytes(cfg, n) == pytest.approx(want)


def test_calibration_point_matches_the_paper_host_share():
    single = compile_plan(make_config(**CALIBRATION)).cost.single
    assert single.host_share == pytest.approx(0.36, abs=0.005)
    assert single.network_share < 0.02  # the model gives ~0.4%; the paper measured ~2%


def test_da_on_one_host_is_infeasible_with_a_reason():
    cfg = make_config(model="tiny", workload="arith", hardware="cpu",
                      mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 2})
    cost = estimate(cfg, layout(1, 2))
    assert not cost.da.feasible and "2 hosts" in cost.da.note and cost.da.step_s == 0
    assert cost.co.feasible and cost.single.feasible


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_da_step_overlaps_only_with_staleness(staleness):
    cfg = make_config(model="qwen3_0_6b", workload="gsm8k", hardware="v7x",
                      mesh={"kind": "tpu", "chips": 16}, placement={
                          "mode": "disaggregated", "rollout_fraction": 0.5,
                          "max_staleness": staleness})
    da = estimate(cfg, layout(4, 8, chips=16, fsdp=8, rollout=2, trainer=2,
                              rounds=(3e8, 3e8), link="dcn")).da
    work = da.reward_s + da.batch_s
    serial = da.rollout_s + work + da.train_s + da.transfer_s
    if staleness == 0:
        assert da.step_s == pytest.approx(serial + da.dispatch_s + da.network_s, rel=1e-12)
    else:
        assert da.step_s < serial
        assert da.step_s >= max(da.rollout_s + work, da.train_s) + da.transfer_s
    assert da.exposed_transfer_s == da.transfer_s > 0


def test_da_transfer_sums_rounds_over_the_host_link():
    cfg = make_config(model="qwen3_0_6b", workload="gsm8k", hardware="h100",
                      mesh={"kind": "gpu", "chips": 32},
                      placement={"mode": "disaggregated", "rollout_fraction": 0.5})
    c, hw = cfg.hardware.cost, cfg.hardware
    da = estimate(cfg, layout(4, 8, fsdp=8, rollout=2, trainer=2, rounds=(1e9, 5e8),
                              link="dcn")).da
    host_bw = hw.dcn_bytes_per_s * 8 * c.network_efficiency
    assert da.transfer_s == pytest.approx(1.5e9 / host_bw + 2 * c.collective_latency_s)


def test_dcn_collectives_cost_more_than_ici_for_the_same_group():
    cfg = make_config(model="qwen3_8b", workload="gsm8k", hardware="h100",
                      mesh={"kind": "gpu", "chips": 16})
    across_hosts = layout(2, 8, fsdp=16, tp=2)
    gpu = estimate(cfg, across_hosts).co
    torus = dataclasses.replace(cfg.hardware, slice_topology="torus3d")
    tpu_like = estimate(dataclasses.replace(cfg, hardware=torus), across_hosts).co
    # 1.9x: 3 FSDP gathers / scatters per micro-batch (no pi_old forward at one update)
    assert gpu.network_s > 1.5 * tpu_like.network_s


def test_more_chips_of_a_compiled_plan_never_slow_a_phase():
    previous = None
    for chips in (8, 16, 32, 64):
        cfg = make_config(**{**CALIBRATION, "mesh": {"kind": "tpu", "chips": chips}})
        cost = compile_plan(cfg).cost
        if previous is not None:
            for mode in ("co", "da", "single"):
                now, before = getattr(cost, mode), getattr(previous, mode)
                if now.feasible and before.feasible:
                    assert now.rollout_s <= before.rollout_s
                    assert now.train_s <= before.train_s
        previous = cost


def test_estimate_round_trips_through_json_and_names_its_constants():
    cfg = make_config(**CALIBRATION)
    cost = estimate(cfg, layout(2, 8, chips=8, fsdp=8))
    assert from_data(CostEstimate, to_data(cost)) == cost
    named = {a.name: a for a in cost.assumptions}
    assert named["dispatch_s"].value == cfg.hardware.cost.dispatch_s
    assert named["dispatch_s"].source == cfg.hardware.cost.source
    assert named["peak_flops_bf16"].value == cfg.hardware.peak_flops_bf16
    assert named["param_count"].value == param_count(cfg.model)


def test_prefill_counts_the_output_projection_for_the_last_prompt_token_only():
    model = make_config(**CALIBRATION).model
    head = 2 * model.vocab * model.hidden
    assert flops.prefill_flops(model, 1) == flops.forward_flops(model, 1)
    for lp in (2, 32, 256):
        assert flops.forward_flops(model, lp) - flops.prefill_flops(model, lp) == head * (lp - 1)
        assert flops.prefill_flops(model, lp) > flops.prefill_flops(model, lp - 1)


@pytest.mark.parametrize("placement, controller", [
    ({"mode": "colocated"}, "local"),
    ({"mode": "disaggregated", "rollout_fraction": 0.75, "max_staleness": 2}, "local"),
    ({"mode": "auto", "rollout_fraction": 0.5, "max_staleness": 1}, "local"),
    ({"mode": "colocated"}, "single"),
])
def test_a_plan_re_estimated_costs_its_own_mode_as_compiled(placement, controller):
    plan = compile_plan(make_config(model="qwen3_0_6b", workload="gsm8k", hardware="v7x",
                               mesh={"kind": "tpu", "chips": 32}, placement=placement,
                               controller=controller))
    assert plan.cost_mode == ("single" if controller == "single" else
                              "da" if plan.placement.mode == "disaggregated" else "co")
    assert getattr(estimate_plan(plan), plan.cost_mode) == plan.own_cost

"""Transfer pass: balanced slices and round-robin rounds that deliver every slice once."""

import dataclasses
from collections import Counter

import pytest
from compiler_cases import entry, make_config

from compiler import compile_plan
from compiler.params import param_table
from compiler.passes.transfer import da_rounds, split_slices


def _rows(slices):
    rows = Counter()
    for sl in slices:
        for piece in sl.pieces:
            assert 0 <= piece.start < piece.stop
            rows[piece.name] += piece.stop - piece.start
    return rows


@pytest.mark.parametrize("model", ["tiny", "qwen3_0_6b", "qwen3_32b", "llama3_405b"])
@pytest.mark.parametrize("k", [1, 2, 3, 7, 16, 64])
def test_slices_cover_every_row_once_and_balance_bytes(model, k):
    table = param_table(entry("model", model))
    slices = split_slices(table, k, 2)
    assert [s.index for s in slices] == list(range(k))
    assert _rows(slices) == Counter({p.name: p.shape[0] for p in table})
    total = sum(p.size for p in table) * 2
    assert sum(s.bytes for s in slices) == total
    biggest_row = max(p.size // p.shape[0] for p in table) * 2
    # each cut lands within one row of the byte target, so slices differ by at most 2 rows
    assert max(s.bytes for s in slices) - total / k <= 2 * biggest_row


@pytest.mark.parametrize("trainers,groups,receivers,k", [
    (16, 16, 48, 1), (4, 1, 12, 4), (32, 2, 96, 16), (6, 2, 2, 3), (8, 4, 3, 2)])
def test_rounds_deliver_each_slice_once_without_link_reuse(trainers, groups, receivers, k):
    table = param_table(entry("model", "qwen3_0_6b"))
    slices = split_slices(table, k, 2)
    senders = tuple(range(100, 100 + trainers))
    dsts = tuple(range(receivers))
    rounds = da_rounds(senders, dsts, slices, groups)
    got = Counter()
    for sends in rounds:
        assert len({s.src for s in sends}) == len(sends)
        assert len({(s.src, s.dst) for s in sends}) == len(sends)
        assert len({s.dst for s in sends}) == len(sends)
        got.update((s.dst, s.slice) for s in sends)
    assert got == Counter((d, i) for d in dsts for i in range(k))
    assert len(rounds) == max(k, -(-receivers // groups))


def test_colocated_transfer_is_on_host():
    plan = compile_plan(make_config(mesh={"kind": "cpu", "hosts": 2, "devices_per_host": 2}))
    t = plan.transfer
    assert t.link == "none" and len(t.rounds) == 1
    assert all(s.src == s.dst for s in t.rounds[0])


def test_disaggregated_transfer_uses_every_trainer():
    cfg = make_config(model="qwen3_8b", workload="gsm8k", hardware="v7x",
                      mesh={"kind": "tpu", "chips": 64},
                      placement={"mode": "disaggregated", "rollout_fraction": 0.75})
    plan = compile_plan(cfg)
    t = plan.transfer
    assert t.link == "ici"
    senders = {s.src for s in t.rounds[0]}
    assert senders == set(plan.partitions.trainer_hosts)
    assert t.total_bytes == t.model_bytes * len(plan.partitions.rollout_hosts)
    assert t.round_bytes == tuple(max(s.bytes for s in r) for r in t.rounds)


def test_lora_disaggregated_transfer_sends_the_adapters_only():
    from compiler.params import adapter_table
    from compiler.sections import LoraConfig

    lora = LoraConfig(rank=16, alpha=32.0)
    cfg = make_config(model="qwen3_8b", workload="gsm8k", hardware="v7x",
                      mesh={"kind": "tpu", "chips": 64},
                      placement={"mode": "disaggregated", "rollout_fraction": 0.75})
    full = compile_plan(cfg)
    algorithm = dataclasses.replace(cfg.algorithm, lora=lora)
    plan = compile_plan(dataclasses.replace(cfg, algorithm=algorithm))
    t, b = plan.transfer, 2  # bf16 slices
    table = adapter_table(cfg.model, lora)
    adapter_bytes = sum(p.size for p in table) * b
    assert sum(s.bytes for s in t.slices) == adapter_bytes
    assert {p.name for s in t.slices for p in s.pieces} == {p.name for p in table}
    assert t.total_bytes == adapter_bytes * len(plan.partitions.rollout_hosts)
    # Rank 16 on all seven matmuls of Qwen3-8B: well under 1% of the model's bytes.
    assert adapter_bytes < 0.01 * t.model_bytes and t.model_bytes == full.transfer.model_bytes
    assert plan.cost.da.transfer_s < full.cost.da.transfer_s  # the cost model uses them


def _qwen3_8b_full_and_lora16():
    """(config, its algorithm with LoRA rank 16, the full fine-tuning plan, the LoRA plan):
    Qwen3-8B, GSM8K, 64 v7x chips."""
    cfg = make_config(model="qwen3_8b", workload="gsm8k", hardware="v7x",
                      mesh={"kind": "tpu", "chips": 64})
    lora = dataclasses.replace(cfg.algorithm, lora=dataclasses.replace(cfg.algorithm.lora,
                                                                       rank=16))
    return cfg, lora, compile_plan(cfg), compile_plan(dataclasses.replace(cfg, algorithm=lora))


def test_lora_plan_counts_the_adapters_and_a_smaller_state():
    from compiler.cost import memory

    cfg, lora, full, plan = _qwen3_8b_full_and_lora16()
    assert full.model.trainable_count == full.model.param_count and full.model.adapter_bytes == 0
    m = plan.model
    # rank 16 on q, k, v, o, gate, up, down of 36 layers: 16 x (in + out) each.
    d, h, k, hd, f = (cfg.model.hidden, cfg.model.num_heads, cfg.model.num_kv_heads,
                      cfg.model.head_dim, cfg.model.ffn)
    per_layer = 16 * ((d + h * hd) * 2 + 2 * (d + k * hd) + 3 * (d + f))
    assert m.trainable_count == cfg.model.num_layers * per_layer
    assert m.adapter_bytes == m.trainable_count * 2
    assert memory.training_state_bytes(cfg.model, lora) < \
        memory.training_state_bytes(cfg.model, cfg.algorithm) / 5


def test_lora_train_step_estimate_counts_adapter_state_and_the_frozen_base():
    from compiler.cost import memory
    from compiler.params import param_table

    cfg, lora, full, plan = _qwen3_8b_full_and_lora16()
    assert plan.batch.train_step_bytes_per_device < full.batch.train_step_bytes_per_device
    assert plan.batch.micro_batches <= full.batch.micro_batches
    assert plan.batch.train_resident_bytes_per_device == 0  # the reference is the base
    table, adapters = param_table(cfg.model), memory.adapter_elements(cfg.model, lora)
    args = dict(params_per_device=1e9, fsdp=4, batch_rows=8, micro_rows=2, micro_batches=4,
                seq_len=1024, response_len=768, remat=True, keep_probs=False,
                fused_attention=False, platform="tpu", table=table)
    ft = memory.train_step_memory(cfg.model, **args)
    lo = memory.train_step_memory(cfg.model, **args, adapters=adapters)
    # Adapters, their gradient, accumulator and moments in fp32; the base in bf16.
    assert (lo.state, lo.accumulator, lo.frozen) == (3 * adapters * 4, adapters * 4, 2e9)
    assert (ft.state, ft.frozen) == (3 * 4e9, 0.0)
    # No head gradient; the same activations and gathered weights (FSDP).
    assert lo.activations == ft.activations and lo.weight_copies == ft.weight_copies
    assert lo.phases["head"] == ft.phases["head"] - cfg.model.vocab * cfg.model.hidden * 4 / 4

"""The plan's rollout numbers are the engine's: its slots, and its per-device memory estimate
against XLA's own count for the compiled slot program at Qwen3-0.6B widths (2 layers, bf16
KV), compiled only (nothing allocated or run)."""

import numpy as np
import pytest
from compiler_cases import make_config

from compiler import PlanError, compile_plan
from compiler.config import DType
from locojax.model import ModelArch, abstract_model
from locojax.rollout.engine import EngineOptions, compile_programs
from locojax.rollout.sampler import SamplingSettings
from locojax.runtime.assemble import engine_options


def _plan(slots: int = 0, prompt_store: int = 0, **workload):
    cfg = make_config(model="qwen3_0_6b", workload="gsm8k",
                      mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 1},
                      overrides={"model": {"num_layers": 2, "dtype": DType.float32},
                                 "workload": {"prompts_per_step": 16, "max_response_len": 256,
                                              **workload},
                                 "sampling": {"slots": slots, "prompt_store": prompt_store,
                                              "kv_dtype": DType.bfloat16}})
    return compile_plan(cfg)


def _arch(plan) -> ModelArch:
    m = plan.model.config
    return ModelArch(num_layers=m.num_layers, hidden=m.hidden, num_heads=m.num_heads,
                     num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, ffn=m.ffn, vocab=m.vocab,
                     tie_embeddings=m.tie_embeddings, dtype=str(m.dtype))


def _peak(plan) -> int:
    """Peak bytes XLA counts for the generation's two programs at the plan's numbers."""
    b = plan.batch
    graphdef, params = abstract_model(_arch(plan))
    prompts = (np.zeros((b.prompts_per_rollout_host, b.max_prompt_len), np.int32),
               np.full(b.prompts_per_rollout_host, b.max_prompt_len, np.int32))
    programs = compile_programs((graphdef, params), prompts,
                                SamplingSettings(max_new_tokens=b.response_len),
                                group_size=b.group_size,
                                options=engine_options(plan.sampling, b.slots,
                                                       b.prompt_store_rows))
    peak = 0
    for program in programs:
        m = program.memory_analysis()
        peak = max(peak, m.argument_size_in_bytes + m.output_size_in_bytes
                   + m.temp_size_in_bytes - m.alias_size_in_bytes)
    return peak


def test_slot_program_memory_matches_the_plan():
    plans = {slots: _plan(slots=slots) for slots in (16, 48)}
    b = plans[48].batch
    assert (b.slots, b.rollout_waves, b.prompt_store_rows) == (48, 3, 16)
    assert b.prompt_store_refills == 0
    assert engine_options(plans[48].sampling, b.slots, b.prompt_store_rows) == EngineOptions(
        slots=48, store_prompts=16, kv_dtype="bfloat16")
    assert b.kv_bytes_per_sequence == 2 * 2 * 8 * 128 * 2 * (256 + 256)  # bf16 K and V
    peaks = {slots: _peak(plan) for slots, plan in plans.items()}
    for slots, plan in plans.items():
        assert peaks[slots] == pytest.approx(plan.batch.rollout_bytes_per_device, rel=0.25)
    # What 32 more slots cost (their KV and sampling workspace), estimated and compiled.
    want = plans[48].batch.rollout_bytes_per_device - plans[16].batch.rollout_bytes_per_device
    assert peaks[48] - peaks[16] == pytest.approx(want, rel=0.25)


def test_the_kv_budget_sets_the_slots():
    free = _plan()
    b = free.batch
    assert b.slots == b.sequences_per_rollout_replica and b.rollout_waves == 1
    # Asked for more than fit: the plan refuses, naming the key.
    too_many = int(free.topology.device_memory_bytes // b.kv_bytes_per_sequence) + 1
    with pytest.raises(PlanError) as err:
        _plan(slots=too_many, prompts_per_step=too_many // 8 + 1)
    assert err.value.key == "sampling.slots"


def test_a_chunked_store_program_matches_the_plan():
    """A store of 4 of the 16 prompts, refilled by prefills inside the slot loop: the slot
    program (store, slots and the loop's prefill) against the plan's smaller estimate."""
    whole, chunked = _plan(slots=16), _plan(slots=16, prompt_store=4)
    b = chunked.batch
    assert (b.prompt_store_rows, b.prompt_store_refills, b.slots) == (4, 3, 16)
    saved = 12 * 2 * 2 * 8 * 128 * 2 * 256  # 12 prompts' bf16 K and V of 256 tokens
    assert whole.batch.rollout_bytes_per_device - b.rollout_bytes_per_device == saved
    assert _peak(chunked) == pytest.approx(b.rollout_bytes_per_device, rel=0.25)

"""A single-turn plan's slot loop against the TPU compiler's peaks measured for it.

`+experiment=gsm8k_co` on v5e:2x4 (8 chips, one host), the rollout programs compiled with
libtpu 0.0.42.1 (`python -m locojax.aot.worker PLAN OUT rollout_prefill,rollout_slots`,
~1 CPU-minute each: too long for the suite; the 2-layer v5e programs are compiled there,
tests/e2e/test_aot_tpu.py). A slot's bytes are its KV cache, the sampler's vocabulary-sized
arrays and, where the slot loop scans stacked caches without the TPU decode kernel, one
layer's re-laid K and V (`compiler.cost.memory.rollout_bytes`, `tpu_decode_kernel`: Qwen3's
and Llama's slot loops here run the kernel, re-measured after it); Gemma 3's sliding layers keep a ring of their window
(`kv_columns`), which takes per-layer caches instead (docs/models.md).
"""

import pytest

from compiler import compile_plan
from locojax.config.compose import compose_config

GSM8K_V5E = ["+experiment=gsm8k_co", "mesh=v5e", "mesh.chips=8"]
MEASURED = {
    # model, sampling.slots (None: the plan's) -> the compiler's slot-loop peak per device
    ("qwen3_0_6b", 32): 6_618_790_400,   # the TPU decode kernel (before it: 6,671,205,376)
    ("qwen3_0_6b", 64): 10_376_986_112,  # (before it: 10,630,726,656)
    ("gemma3_1b", 128): 4_815_431_680,
    ("gemma3_1b", None): 9_647_281_152,   # 384 slots
    ("llama3_2_1b", None): 13_139_700_224,  # 265 slots
}


def _plan(model: str, slots: int | None):
    extra = [] if slots is None else [f"sampling.slots={slots}"]
    return compile_plan(compose_config([*GSM8K_V5E, f"model={model}", *extra]))


@pytest.mark.parametrize(("model", "slots"), list(MEASURED), ids=str)
def test_the_slot_loop_is_within_10_percent_of_the_compilers_peak(model, slots):
    b = _plan(model, slots).batch
    assert 0.9 <= b.rollout_bytes_per_device / MEASURED[model, slots] <= 1.1


@pytest.mark.parametrize(("model", "few", "many"), [("qwen3_0_6b", 32, 64),
                                                    ("gemma3_1b", 128, None)])
def test_a_slot_costs_what_it_costs_the_compiler(model, few, many):
    """The per-slot bytes, from two slot counts: Qwen3-0.6B 112.0 MiB through the TPU decode
    kernel (its KV; 118.0 before it, with one layer's re-laid K and V and three 151,936-entry
    fp32 arrays), where the plan counts 113.7 (the KV and the three arrays, which between 32
    and 64 slots stay under the loop's other temporaries); Gemma-3-1B 18.0 MiB (15 of KV: 22
    of its 26 layers keep 512 of 1,024 columns; three 262,144-entry arrays; no re-laid
    layer: per-layer caches, no kernel)."""
    a, b = _plan(model, few).batch, _plan(model, many).batch
    plan = (b.rollout_bytes_per_device - a.rollout_bytes_per_device) / (b.slots - a.slots)
    compiler = (MEASURED[model, many] - MEASURED[model, few]) / (b.slots - a.slots)
    assert plan == pytest.approx(compiler, rel=0.02)


@pytest.mark.parametrize(("extra", "kernel"), [
    ([], True),                                    # one device a replica, 1,024 columns
    (["mesh.rollout_tensor_parallel=2"], False),  # a replica spans two devices
    (["workload.max_prompt_len=200"], False),     # 968 columns: not a multiple of 128
    (["model=llama3_2_1b"], False),                # 64-wide heads (docs/models.md)
])
def test_a_layer_is_re_laid_only_where_xla_attends(extra, kernel):
    """The TPU decode kernel reads each layer's K and V in place from the stacked caches
    (`locojax.rollout.backend.tpu_kernels_unusable`, `tpu_stacked_attention`); where it
    does not run, XLA's attention slices the layer out and the plan counts its copy."""
    a, b = (compile_plan(compose_config([*GSM8K_V5E, f"sampling.slots={s}", *extra]))
            for s in (8, 16))
    model = a.model.config
    per_slot = (b.batch.rollout_bytes_per_device - a.batch.rollout_bytes_per_device) / 8
    relaid = per_slot - a.batch.kv_bytes_per_sequence - 3 * model.vocab * 4
    layer = a.batch.kv_bytes_per_sequence / model.num_layers
    assert relaid == pytest.approx(0.0 if kernel else layer, abs=1.0)

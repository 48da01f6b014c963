"""The plan's train-step memory per device against XLA's own figure for the compiled step.

Real GRPO train steps at Qwen3-0.6B widths (hidden 1024, 16 q / 8 kv heads, head_dim 128,
ffn 3072, vocab 151,936) with 2 and 4 layers and GSM8K's row shape (256 prompt + 768
response tokens) are lowered and compiled from abstract shapes only (nothing is allocated),
with the micro-batches, head mode and dtypes the plan chose, and
`compile().memory_analysis()` (arguments + outputs - aliased + temporaries) is held against
`plan.batch.train_step_bytes_per_device` within 25%. The device memory is set per case so
the plan picks gradient accumulation, or the kept-softmax head. The supervised warm-up's step
(`batch.sft_micro_batches`, `sft_step_bytes_per_device`) is held the same way. LoRA cases
(rank 16 on all seven block matmuls) compile the step as the trainer runs it: the adapters and
their moments (donated), the batch and the frozen base in the compute dtype
(`locojax.train.lora.lora_split`).
"""

import jax
import jax.numpy as jnp
import pytest

from compiler import compile_plan
from compiler.cost.memory import dtype_bytes
from locojax.config.compose import compose_config
from locojax.model.lora import abstract_adapters
from locojax.model.qwen3 import abstract_model
from locojax.runtime import assemble
from locojax.train import SftBatch, TrainBatch, make_optimizer, make_sft_step, make_train_step
from locojax.train.lora import lora_split

pytestmark = pytest.mark.tpu

CASES = {
    # 16 rows that do not fit at once: 4 micro-batches of 4 rows, summed gradients.
    "2_layers_micro_batches": dict(layers=2, prompts=4, hbm=5.2e9, micro=4, keep=False),
    "4_layers": dict(layers=4, prompts=2, hbm=7e9, micro=1, keep=False),
    # Room to keep the head's T x V softmax for the backward pass; bf16 compute.
    "2_layers_bf16_kept_head": dict(layers=2, prompts=2, hbm=2.4e10, micro=1, keep=True,
                                    dtype="bfloat16"),
    # LoRA: 16 rows in 2 micro-batches on a 3 GB device (full fine-tuning's state alone
    # would not fit); bf16 base with the kept head.
    "2_layers_lora_micro_batches": dict(layers=2, prompts=4, hbm=3e9, micro=2, keep=False,
                                        lora=16),
    "2_layers_lora_bf16_kept_head": dict(layers=2, prompts=2, hbm=2.4e10, micro=1, keep=True,
                                         dtype="bfloat16", lora=16),
}


def _plan(layers, prompts, hbm, dtype="float32", warm_up=0, lora=0):
    return compile_plan(compose_config([
        "+experiment=gsm8k_co", f"model.num_layers={layers}", f"model.dtype={dtype}",
        "mesh=cpu", "mesh.hosts=1", "mesh.devices_per_host=1",
        f"workload.prompts_per_step={prompts}", "workload.group_size=4",
        f"hardware.hbm_bytes={hbm}", f"algorithm.sft_warmup_steps={warm_up}",
        f"algorithm.lora.rank={lora}",
        "algorithm.optimizer_steps_per_batch=1"]))  # the cases' row counts are one update's


def _analysed_bytes(compiled) -> int:
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes)


def _compiled_bytes(plan) -> int:
    """XLA's allocation for the plan's train step on one device."""
    arch = assemble.model_arch(plan.model.config)
    graphdef, params = abstract_model(arch)
    b = plan.batch
    grpo = assemble.grpo_settings(plan.algorithm, b.response_len, plan.run.steps,
                                  temperature=plan.sampling.temperature,
                                  micro_batches=b.micro_batches, keep_probs=b.keep_head_probs)
    rows, length = b.rows_per_trainer_device, b.seq_len

    def spec(dtype, shape=(rows, length)):
        return jax.ShapeDtypeStruct(shape, dtype)

    batch = TrainBatch(spec(jnp.int32), spec(jnp.int32), spec(jnp.bool_), spec(jnp.bool_),
                       spec(jnp.float32, (rows,)), spec(jnp.float32))
    lora = assemble.lora_spec(plan.algorithm)
    if lora is None:
        opt_state = jax.eval_shape(make_optimizer(grpo.optimizer).init, params)
        step = make_train_step(graphdef, grpo).lower(params, opt_state, batch)
        return _analysed_bytes(step.compile())
    # The trainer's LoRA step: trained adapters, frozen base in the compute dtype.
    adapters = abstract_adapters(arch, lora)
    opt_state = jax.eval_shape(make_optimizer(grpo.optimizer).init, adapters)
    base = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, arch.jnp_dtype), params)
    step = make_train_step(graphdef, grpo, split=lora_split(lora))
    return _analysed_bytes(step.lower(adapters, opt_state, batch, base).compile())


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_memory_estimate_within_25_percent_of_the_compiled_step(name):
    case = dict(CASES[name])
    micro, keep = case.pop("micro"), case.pop("keep")
    plan = _plan(**case)
    b = plan.batch
    assert (b.micro_batches, b.keep_head_probs) == (micro, keep)
    assert b.seq_len == 1024 and b.response_len == 768
    estimate, compiled = b.train_step_bytes_per_device, _compiled_bytes(plan)
    assert 0.75 <= estimate / compiled <= 1.25, (name, estimate, compiled)
    # The other terms matter: parameters and moments (LoRA: the base and the adapters'
    # state) alone are far from the compiled figure.
    lora = plan.algorithm.lora.rank > 0
    state = plan.model.param_count * (dtype_bytes(plan.model.config) if lora else 4 * 3)
    assert state < 0.75 * compiled


def test_warm_up_step_estimate_within_25_percent_of_the_compiled_step():
    # 16 warm-up rows (one per prompt) in 4 micro-batches on a 6 GB device.
    plan = _plan(layers=2, prompts=16, hbm=6e9, warm_up=1)
    b = plan.batch
    assert (b.sft_rows_per_trainer_device, b.sft_micro_batches, b.sft_keep_head_probs) == (
        16, 4, False)
    arch = assemble.model_arch(plan.model.config)
    graphdef, params = abstract_model(arch)
    forward = assemble.forward_settings(plan.algorithm, b.response_len,
                                        micro_batches=b.sft_micro_batches,
                                        keep_probs=b.sft_keep_head_probs)
    optimizer = assemble.sft_optimizer(plan.algorithm)
    opt_state = jax.eval_shape(make_optimizer(optimizer).init, params)
    shape = (b.sft_rows_per_trainer_device, b.seq_len)
    batch = SftBatch(*(jax.ShapeDtypeStruct(shape, dt)
                       for dt in (jnp.int32, jnp.int32, jnp.bool_, jnp.bool_)))
    compiled = _analysed_bytes(make_sft_step(graphdef, optimizer, forward=forward)
                               .lower(params, opt_state, batch).compile())
    assert 0.75 <= b.sft_step_bytes_per_device / compiled <= 1.25, (
        b.sft_step_bytes_per_device, compiled)

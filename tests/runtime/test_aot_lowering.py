"""The AOT path lowers the runtime's own programs: its StableHLO for CPU devices equals what the
runtime lowers from real arrays, and the same programs lower for `cuda` (StableHLO only).

The plan: the arithmetic task on a tiny Qwen3 (bf16 compute over fp32 masters, so CO's reshard
is a real cast) on one emulated host of 8 CPU devices: FSDP 8, 4 rollout replicas of 2-way tensor parallelism, 4 slots each, pi_old
from the train step's own forward (one update per batch) and the sampler's log-probs for the
rollout correction (rollout_correction != none).
"""

import jax
import numpy as np
import pytest

from compiler import compile_plan
from locojax import aot
from locojax.config.compose import compose_config
from locojax.rollout import engine
from locojax.runtime import adapters as adapters_mod
from locojax.runtime import weights
from locojax.runtime.components import build_host
from locojax.runtime.train_programs import global_batch, make_steps
from locojax.train import TrainBatch, init_opt_state, make_optimizer

OVERRIDES = ["+experiment=arith_co", "model=tiny", "model.num_layers=2", "model.dtype=bfloat16",
             "mesh=cpu", "mesh.hosts=1", "mesh.devices_per_host=8",
             "workload.prompts_per_step=16", "workload.group_size=4", "sampling.slots=4",
             "mesh.rollout_tensor_parallel=2"]


@pytest.fixture(scope="module")
def plan():
    return compile_plan(compose_config(OVERRIDES))


def _rows(plan) -> dict[str, np.ndarray]:
    b = plan.batch
    shape = (b.sequences_per_step, b.seq_len)
    return {"tokens_BxL": np.ones(shape, np.int32), "positions_BxL": np.zeros(shape, np.int32),
            "valid_BxL": np.ones(shape, bool), "loss_mask_BxL": np.ones(shape, bool),
            "advantages_B": np.zeros(shape[:1], np.float32),
            "behaviour_logp_BxL": np.zeros(shape, np.float32),
            **({"rollout_logp_BxL": np.zeros(shape, np.float32)}
               if plan.algorithm.rollout_logp else {})}


def _runtime_texts(plan) -> dict[str, str]:
    """What the runtime lowers on this process's devices, from real arrays."""
    host = build_host(plan, 0)
    steps = make_steps(host)
    params = weights.initial_params(host)
    opt = init_opt_state(make_optimizer(host.grpo.optimizer), params, host.model.param_shardings)
    batch = global_batch(host, _rows(plan), TrainBatch)
    if steps.rescore is not None:
        batch = steps.rescore(params, None, batch)
    out = {"train_step": steps.train.lower(params, opt, batch).as_text()}
    rollout = weights.rollout_params(host, params)
    b = plan.batch
    prompts = (np.ones((b.prompts_per_rollout_host, b.max_prompt_len), np.int32),
               np.full((b.prompts_per_rollout_host,), 3, np.int32))
    job = engine._setup((host.model.graphdef, rollout), prompts, host.sampling, b.group_size,
                        host.model.rollout_mesh, "replica", "tensor", host.engine)
    static = dict(graphdef=job.graphdef, settings=job.settings, layout=job.layout)
    key = jax.random.key(0)
    out["rollout_prefill"] = engine._prefill.lower(job.params, job.store_prompts,
                                                   job.store_len, key, **static).as_text()
    store_k, store_v, first, u, rope = engine._prefill(job.params, job.store_prompts,
                                                       job.store_len, key, **static)
    out["rollout_slots"] = engine._decode.lower(
        job.params, store_k, store_v, first, job.store_len, u, rope, job.prompt_BxW,
        job.chunk_prompts, backend=job.backend, **static).as_text()
    dtype = jax.numpy.dtype(host.model.compute_dtype)
    targets = jax.tree.leaves(weights.rollout_shardings(host, params))
    out["reshard"] = "\n".join(weights._cast_to.lower(x, dtype, s).as_text() for x, s in zip(
        jax.tree.leaves(params), targets, strict=True) if x.dtype != dtype)
    return out


def test_aot_stablehlo_for_cpu_devices_equals_the_runtimes(plan):
    assert plan.batch.slots < plan.batch.sequences_per_rollout_replica  # the slot loop refills
    ours = aot.lower_programs(plan, jax.devices(), "cpu")
    theirs = _runtime_texts(plan)
    assert set(ours) == set(theirs) == {"train_step", "rollout_prefill", "rollout_slots",
                                        "reshard"}
    for name in ours:
        assert ours[name] == theirs[name], name


def test_programs_lower_for_cuda(plan):
    texts = aot.lower_programs(plan, jax.devices(), "cuda")
    assert set(texts) == {"train_step", "rollout_prefill", "rollout_slots", "reshard"}
    for name, text in texts.items():
        assert "func.func public @main" in text, name
        assert "locojax_" not in text, name  # no CPU kernel (`locojax.kernels.cpu` targets)


def test_slice_hosts_split_devices_as_the_plan_does(plan):
    with pytest.raises(ValueError, match="8 devices"):
        aot.programs.slice_hosts(plan, jax.devices()[:4])
    two = compile_plan(compose_config([*OVERRIDES[:4], "mesh=cpu", "mesh.hosts=2",
                                  "mesh.devices_per_host=4", *OVERRIDES[7:10]]))
    hosts = aot.programs.slice_hosts(two, jax.devices())
    assert [len(h) for h in hosts.devices] == [4, 4]
    assert hosts.of((1,)) == list(jax.devices()[4:])
    # Two training hosts: the runtime reshards through host memory (no program to compile).
    assert aot.programs.reshard_is_a_program(plan)
    assert not aot.programs.reshard_is_a_program(two)


def test_aot_lora_train_step_and_merge_equal_the_runtimes():
    # LoRA (rank 4, KL to the base): the step takes (adapters, moments, batch, base), and
    # CO's rollout copy is the trainer's merge of the base and the adapters.
    lora = compile_plan(compose_config([*OVERRIDES, "algorithm.lora.rank=4",
                                        "algorithm.kl_coef=0.01"]))
    ours = aot.lower_programs(lora, jax.devices(), "cpu")
    host = build_host(lora, 0)
    steps = make_steps(host)
    base, adapters = adapters_mod.base_params(host), adapters_mod.fresh_adapters(host)
    opt = init_opt_state(make_optimizer(host.grpo.optimizer), adapters,
                         host.model.adapter_shardings)
    batch = steps.rescore(adapters, base, global_batch(host, _rows(lora), TrainBatch), base)
    assert ours["train_step"] == steps.train.lower(adapters, opt, batch, base).as_text()
    dtype = jax.numpy.dtype(host.model.compute_dtype)
    assert ours["reshard"] == adapters_mod._merge.lower(base, adapters, host.model.lora,
                                                       dtype).as_text()


def test_a_preset_with_a_checkpoint_vocabulary_builds_without_a_checkpoint():
    """A Llama preset (model.tokenizer=checkpoint, no checkpoint) compiles with the char
    tokenizer: ids change no program's shape; a plan with a checkpoint keeps its own."""
    llama = compile_plan(compose_config(["+experiment=gsm8k_co", "model=llama3_2_1b",
                                         "mesh=v5e", "mesh.chips=8"]))
    assert llama.model.config.tokenizer == "checkpoint"
    built = aot.programs._without_checkpoint_vocabulary(llama)
    assert built.model.config.tokenizer == "char"
    assert built.model.config.vocab == llama.model.config.vocab == 128256
    tiny = compile_plan(compose_config(OVERRIDES))
    assert aot.programs._without_checkpoint_vocabulary(tiny) is tiny

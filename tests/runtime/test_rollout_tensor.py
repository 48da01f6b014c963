"""Tensor-parallel rollout as the plan lays it out: parameters on the plan's rollout specs
(heads, kv heads, ffn and vocab over `tensor`), rows over `replica`, the same tokens and
log-probs as one device."""

import jax
import numpy as np
import pytest
from compiler_cases import make_config
from flax import nnx
from jax.sharding import Mesh

from compiler import compile_plan
from locojax.model import ModelArch, Qwen3, split_params
from locojax.rollout.engine import EngineOptions, compile_programs, generate
from locojax.rollout.sampler import SamplingSettings
from locojax.train.sharding import param_shardings

SHAPE = dict(num_layers=2, hidden=128, num_heads=4, num_kv_heads=2, head_dim=32, ffn=256,
             vocab=640)
ARCH = ModelArch(**SHAPE, dtype="float32")
PROMPTS = [[5, 17, 301, 44], [9], [100, 200, 300, 400, 7, 8, 9], [3, 3]]
SETTINGS = SamplingSettings(max_new_tokens=12, stop_ids=tuple(range(1, 41)))


def _plan(replicas: int, tensor: int, shape=SHAPE):
    cfg = make_config(mesh={"kind": "cpu", "hosts": 1, "devices_per_host": replicas * tensor,
                            "rollout_tensor_parallel": tensor},
                      overrides={"model": {**shape, "dtype": "float32", "tokenizer": "char"}})
    return compile_plan(cfg)


def _placed(params, replicas: int, tensor: int):
    plan = _plan(replicas, tensor)
    assert dict(plan.sharding.rollout.mesh) == {"replica": replicas, "tensor": tensor}
    mesh = Mesh(np.array(jax.devices()[:replicas * tensor]).reshape(replicas, tensor),
                ("replica", "tensor"))
    specs = {name: tuple(spec) for name, spec in plan.sharding.rollout.specs.items()}
    return plan, mesh, jax.device_put(params, param_shardings(mesh, params, specs))


@pytest.fixture(scope="module")
def model():
    return split_params(Qwen3(ARCH, rngs=nnx.Rngs(0)))


@pytest.fixture(scope="module")
def one_device(model):
    return generate(model, PROMPTS, SETTINGS, jax.random.key(3), group_size=4,
                    options=EngineOptions(slots=5, cpu_kernels="off"))


@pytest.mark.parametrize(("replicas", "tensor", "stacked", "store"),
                         [(1, 2, False, 0), (2, 2, True, 0), (2, 2, False, 1)])
def test_tensor_parallel_equals_one_device(model, one_device, replicas, tensor, stacked, store):
    """store = 1: each replica's store holds one of its 2 prompts at a time (the second
    prefilled inside its slot loop)."""
    graphdef, params = model
    plan, mesh, placed = _placed(params, replicas, tensor)
    # Weights are split, not copied: each device holds the plan's bytes per device.
    per_device = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(placed))
    assert per_device == pytest.approx(plan.sharding.rollout.bytes_per_device)
    assert per_device < 0.6 * sum(x.nbytes for x in jax.tree.leaves(params))
    slots = -(-5 // replicas)
    r = generate((graphdef, placed), PROMPTS, SETTINGS, jax.random.key(3), group_size=4,
                 mesh=mesh, options=EngineOptions(slots=slots, stacked_layers=stacked,
                                                  store_prompts=store))
    assert r.stats.prefill_rows == (store or len(PROMPTS) // replicas)
    np.testing.assert_array_equal(r.tokens_BxL, one_device.tokens_BxL)
    np.testing.assert_array_equal(r.lengths_B, one_device.lengths_B)
    np.testing.assert_allclose(r.logp_BxT, one_device.logp_BxT, atol=1e-5, rtol=0)
    np.testing.assert_allclose(r.logp_model_BxT, one_device.logp_model_BxT, atol=1e-5, rtol=0)
    assert r.stats.decode_steps_R.shape == (replicas,)


def test_kv_cache_is_split_by_kv_head():
    """The slot program at tensor = 2 holds half the KV cache per device.

    Four kv heads, two a device: with one kv head a device XLA:CPU fuses each step's cache
    write into two consumers and copies the cache (see docs/rollout.md), which would hide
    the split.
    """
    shape = {**SHAPE, "num_kv_heads": 4}
    arch = ModelArch(**shape, dtype="float32")
    graphdef, params = split_params(Qwen3(arch, rngs=nnx.Rngs(0)))
    prompts = (np.ones((8, 64), np.int32), np.full(8, 64, np.int32))
    settings = SamplingSettings(max_new_tokens=448)
    kv = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * 4 * 64 * (64 + 448)
    temps = {}
    for tensor in (1, 2):
        plan = _plan(1, tensor, shape)
        mesh = Mesh(np.array(jax.devices()[:tensor]).reshape(1, tensor), ("replica", "tensor"))
        specs = {k: tuple(v) for k, v in plan.sharding.rollout.specs.items()}
        placed = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                              params, param_shardings(mesh, params, specs))
        _, decode = compile_programs((graphdef, placed), prompts, settings, group_size=8,
                                     mesh=mesh, options=EngineOptions(cpu_kernels="off"))
        temps[tensor] = decode.memory_analysis().temp_size_in_bytes
    assert kv < temps[1] < 1.2 * kv  # 64 rows x 512 slots of fp32 KV: most of the program
    assert temps[2] == pytest.approx(temps[1] - kv / 2, rel=0.1)


def test_the_runtime_places_rollout_weights_on_the_plans_specs(model):
    """The CO loop's (and DA actors') rollout copy takes the plan's rollout specs, not P()."""
    from locojax.runtime.components import build_host
    from locojax.runtime.weights import rollout_params

    graphdef, params = model
    plan = _plan(1, 2)
    host = build_host(plan, 0, trains=False)
    assert dict(host.model.rollout_mesh.shape)["tensor"] == 2
    local = rollout_params(host, params)
    per_device = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(local))
    assert per_device == pytest.approx(plan.sharding.rollout.bytes_per_device)
    assert host.engine.slots == plan.batch.slots
    assert host.engine.store_prompts == plan.batch.prompt_store_rows
    # A host that never trains has no training layout; it has its problems and scorer. A
    # host built to compile only (`locojax.aot`) has no data part at all.
    assert host.model.param_shardings is None and host.model.adapter_shardings is None
    assert len(host.data.workload.train) > 0 and host.data.scorer is not None
    host.close()
    compile_only = build_host(plan, 0, trains=False, data=False)
    assert compile_only.data is None and compile_only.model.arch == host.model.arch
    compile_only.close()

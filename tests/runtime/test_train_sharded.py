"""The train step on a (data=2, fsdp=4) mesh of 8 CPU devices equals the unsharded step."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, PartitionSpec
from test_train_step import ARCH, SETTINGS, _grpo_batch

from compiler.axes import MeshAxis
from locojax.model import Qwen3, split_params
from locojax.model.qwen3 import flat_params
from locojax.train.optimizer import init_opt_state, make_optimizer
from locojax.train.sharding import batch_sharding, global_batch, param_shardings
from locojax.train.step import make_train_step


@pytest.fixture(scope="module")
def model_params():
    return split_params(Qwen3(ARCH, rngs=nnx.Rngs(0)))


def _fsdp_specs(params):
    """FSDP rule of thumb: first non-layer dimension divisible by 4 goes on 'fsdp'."""
    specs = {}
    for name, var in flat_params(params).items():
        spec = [None] * len(var.shape)
        skip = 1 if name.startswith("layers/") else 0
        for i in range(skip, len(var.shape)):
            if var.shape[i] % 4 == 0 and var.shape[i] >= 8:
                spec[i] = "fsdp"
                break
        specs[name] = tuple(spec)
    return specs


def _mesh():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "fsdp"))


def test_sharded_step_equals_unsharded(model_params):
    graphdef, params = model_params
    mesh = _mesh()
    batch = _grpo_batch(graphdef, params, ref_noise=0.1)
    tx = make_optimizer(SETTINGS.optimizer)

    step = make_train_step(graphdef, SETTINGS, donate=False)
    p1, o1, m1 = step(params, init_opt_state(tx, params), batch)

    p_sh = param_shardings(mesh, params, _fsdp_specs(params))
    b_sh = batch_sharding(mesh)
    sharded = make_train_step(
        graphdef, SETTINGS, param_shardings=p_sh, batch_sharding=b_sh, donate=False
    )
    params_sh = jax.device_put(params, p_sh)
    opt_sh = init_opt_state(tx, params_sh, p_sh)
    p2, o2, m2 = sharded(params_sh, opt_sh, jax.device_put(batch, b_sh))

    for name, var in flat_params(p2).items():
        want = flat_params(p1)[name]
        # Adam turns fp-noise-sized gradients into lr-sized steps, so a rare element may
        # differ by more than fp32 noise; bound the worst case well below lr = 1e-3.
        diff = np.abs(np.asarray(var[...]) - np.asarray(want[...]))
        assert diff.max() < 2e-4 and (diff > 2e-5).mean() < 1e-3, (name, diff.max())
        assert var[...].sharding.spec == PartitionSpec(*_fsdp_specs(params)[name]), name
    moved = flat_params(p2)["embed/embedding"][...] - flat_params(params)["embed/embedding"][...]
    assert float(jnp.abs(moved).max()) > 1e-4  # the update did something
    chex.assert_trees_all_close(m2, m1, rtol=1e-4, atol=1e-6)
    mu = [s for s in jax.tree.leaves(o2) if s.shape == (ARCH.vocab, ARCH.hidden)]
    assert mu and all(s.sharding.spec == PartitionSpec("fsdp", None) for s in mu)
    assert {"loss", "kl", "entropy", "clip_frac", "ratio_mean", "grad_norm", "lr"} <= set(m2)
    # Outputs come back in the input layout: the next step reuses the compiled program.
    sharded(p2, o2, jax.device_put(batch, b_sh))
    assert sharded._cache_size() == 1


def test_param_shardings_reject_mismatched_specs(model_params):
    _, params = model_params
    mesh = _mesh()
    specs = _fsdp_specs(params)
    with pytest.raises(ValueError, match="missing"):
        param_shardings(mesh, params, {k: v for k, v in specs.items() if k != "final_norm/scale"})
    with pytest.raises(ValueError, match="spec"):
        param_shardings(mesh, params, {**specs, "final_norm/scale": ("fsdp", None)})


def test_global_batch_from_process_rows_equals_device_put(model_params):
    graphdef, params = model_params
    mesh = _mesh()
    batch = _grpo_batch(graphdef, params, seed=2)
    host_rows = jax.tree.map(np.asarray, batch)
    made = global_batch(host_rows, batch_sharding(mesh))
    chex.assert_trees_all_equal(made, batch, strict=True)
    assert all(x.sharding.spec == PartitionSpec((MeshAxis.DATA, MeshAxis.FSDP))
               for x in jax.tree.leaves(made))


def test_grpo_step_holds_rows_and_gathers_the_head(model_params):
    # The GRPO loss must run with the row-sharded forward (a merge once dropped it, and the
    # TPU compiler then gave every device every row's MLP products and logits: docs/aot.md):
    # the blocks' B x L x D inputs on the batch's rows, the head's N x D hidden states too,
    # and the output weight (chunk) gathered whole.
    graphdef, params = model_params
    mesh = _mesh()
    batch = _grpo_batch(graphdef, params, ref_noise=0.1)
    step = make_train_step(graphdef, SETTINGS, donate=False,
                           param_shardings=param_shardings(mesh, params, _fsdp_specs(params)),
                           batch_sharding=batch_sharding(mesh))
    tx = make_optimizer(SETTINGS.optimizer)
    text = step.lower(params, init_opt_state(tx, params), batch).as_text()
    d, chunk = ARCH.hidden, SETTINGS.forward.vocab_chunk
    rows = '<@mesh, [{"data", "fsdp"}, {}, {}]> : tensor<'
    assert re.search(re.escape(rows) + rf"\d+x\d+x{d}xf32>", text)  # B x L x D
    assert re.search(re.escape('<@mesh, [{"data", "fsdp"}, {}]> : tensor<') + rf"\d+x{d}xf32>",
                     text)  # N x D into the head
    assert f'<@mesh, [{{}}, {{}}]> : tensor<{chunk}x{d}xf32>' in text  # the gathered weight

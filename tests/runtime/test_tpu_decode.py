"""The TPU decode kernel, run by Pallas's interpreter on the CPU: it reads exactly a slot's
live ring columns, and the engine gives the XLA path's tokens through it."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from locojax.kernels import tpu_decode
from locojax.model import ModelArch, Qwen3, split_params
from locojax.model.ops import ModelOps, attend
from locojax.rollout import backend, engine
from locojax.rollout.engine import EngineOptions, generate, pad_prompts
from locojax.rollout.sampler import SamplingSettings

RNG = np.random.default_rng(0)


def _dense(q, k, v, layer, end, live):
    cols = k.shape[3]
    back = (end % cols - jnp.arange(cols)) % cols
    mask = back[None, :] < live[:, None]
    b, heads, group, hd = q.shape
    ctx = attend(q.reshape(b, 1, heads * group, hd), k[layer], v[layer], mask[:, None])[:, :, :, 0]
    return jnp.where((live > 0)[:, None, None, None], ctx, 0.0)


@pytest.mark.parametrize("end", [300, 700])
def test_decode_kernel_reads_the_live_ring_columns(end):
    n, b, heads, group, cols, hd = 3, 6, 2, 2, 512, 128
    k, v = (jnp.asarray(RNG.normal(size=(n, b, heads, cols, hd)), jnp.float32) for _ in "kv")
    q = jnp.asarray(RNG.normal(size=(b, heads, group, hd)), jnp.float32)
    live = jnp.asarray([0, 1, 130, 512, 77, 260], jnp.int32)
    for layer, budget in ((0, heads * 128 * hd * 4), (2, 3 * heads * 128 * hd * 4)):
        # 1 and 3 slots a grid step
        got = tpu_decode.ragged_decode_attention(q, k, v, layer, end, live, budget=budget,
                                                 interpret=True)
        np.testing.assert_allclose(got, _dense(q, k, v, layer, end, live), atol=2e-6)


def test_blocks_needed_count_the_ring_blocks_a_span_touches():
    live = jnp.asarray([0, 1, 129, 130, 512], jnp.int32)
    # end 700 is column 188 of 512: block 1 (128-255); 130 columns back reach block 0.
    np.testing.assert_array_equal(tpu_decode.blocks_needed(700, live, 512, 128),
                                  [0, 1, 2, 2, 4])
    np.testing.assert_array_equal(tpu_decode.blocks_needed(127, live, 512, 128),
                                  [0, 1, 2, 2, 4])  # 129 back from column 127 wraps to block 3


ARCH = ModelArch(num_layers=2, hidden=128, num_heads=4, num_kv_heads=2, head_dim=128, ffn=256,
                 vocab=640, dtype="float32")
INTERPRET = backend.Backend(
    "tpu kernels (interpreted)",
    ModelOps(stacked_attention=functools.partial(backend.tpu_stacked_attention,
                                                 interpret=True)),
    backend._no_prepare, backend._xla_logits)


@pytest.mark.parametrize("width", [108, 100], ids=["kernel", "dense-fallback"])
def test_engine_through_the_decode_kernel_gives_the_xla_tokens(monkeypatch, width):
    model = split_params(Qwen3(ARCH, rngs=nnx.Rngs(0)))
    prompts = pad_prompts([[5, 17, 301, 44], [9], [100, 200, 300, 400, 7, 8, 9]], length=width)
    settings = SamplingSettings(max_new_tokens=20, stop_ids=tuple(range(1, 65)))

    def run(**options):
        return generate(model, prompts, settings, jax.random.key(3), group_size=4,
                        options=EngineOptions(stacked_layers=True, slots=5, cpu_kernels="off",
                                              **options))

    want = run(tpu_kernels="off")
    monkeypatch.setattr(engine, "choose", lambda *a, **k: INTERPRET)
    got = run()
    assert np.asarray(want.lengths_B).max() > 10  # rows long enough to wrap the ring's blocks
    np.testing.assert_array_equal(got.tokens_BxL, want.tokens_BxL)
    np.testing.assert_allclose(got.logp_model_BxT, want.logp_model_BxT, atol=1e-5)


def test_the_tpu_kernel_switch_says_why_it_does_not_apply_here():
    params = split_params(Qwen3(ARCH, rngs=nnx.Rngs(0)))[1]
    assert backend.tpu_kernels_unusable(params, None, stacked=True) == "not on TPU devices"
    with pytest.raises(backend.KernelsUnavailable, match="TPU kernels do not apply"):
        backend.choose("off", params, None, stacked=True, tpu="on")
    assert backend.choose("off", params, None, stacked=True) is backend.XLA


def test_work_items_walk_each_groups_blocks_back_from_the_write_column():
    need_g = jnp.asarray([2, 0, 3], jnp.int32)  # a group of free slots still gets one item
    items, group_T, block_T, flag_T = tpu_decode.work_items(need_g, 300, 512, 128)
    assert int(items) == 6
    np.testing.assert_array_equal(group_T[:6], [0, 0, 1, 2, 2, 2])
    np.testing.assert_array_equal(block_T[:6], [2, 1, 2, 2, 1, 0])  # column 300: block 2
    np.testing.assert_array_equal(flag_T[:6], [1, 2, 3, 1, 0, 2])
    np.testing.assert_array_equal(flag_T[6:], 0)

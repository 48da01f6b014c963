"""Splash attention, run by Pallas's interpreter on the CPU: the model's causal masked
softmax over valid tokens, forward and gradient, alone and inside the model's forward."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from locojax.model import ModelArch, Qwen3
from locojax.model.ops import ModelOps, masked_attention
from locojax.model.qwen3 import attention_mask
from locojax.train.attention import SplashCausal

RNG = np.random.default_rng(0)
ARCH = ModelArch(num_layers=2, hidden=128, num_heads=4, num_kv_heads=2, head_dim=128, ffn=256,
                 vocab=640, dtype="float32")


def test_splash_is_the_models_causal_attention_forward_and_backward():
    b, length, heads, kv, hd = 2, 256, 4, 2, 128
    q = jnp.asarray(RNG.normal(size=(b, length, heads, hd)), jnp.float32)
    k, v = (jnp.asarray(RNG.normal(size=(b, length, kv, hd)), jnp.float32) for _ in "kv")
    cols = np.arange(length)
    valid = jnp.asarray((cols >= np.array([0, 37])[:, None]) & (cols < np.array([200, 256])[:, None]))
    keep = valid[:, :, None, None]

    def loss(fn):
        return lambda q, k, v: jnp.sum(jnp.where(keep, fn(q, k, v), 0.0) ** 2)

    splash = lambda q, k, v: SplashCausal(interpret=True)(q, k, v, valid)  # noqa: E731
    plain = lambda q, k, v: masked_attention(  # noqa: E731
        q, k, v, attention_mask(b, length, length, 0, valid))
    np.testing.assert_allclose(jnp.where(keep, splash(q, k, v), 0),
                               jnp.where(keep, plain(q, k, v), 0), atol=1e-5)
    for got, want in zip(jax.grad(loss(splash), (0, 1, 2))(q, k, v),
                         jax.grad(loss(plain), (0, 1, 2))(q, k, v), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4 * float(jnp.abs(want).max()))


def test_the_model_forward_through_splash_equals_its_masked_forward():
    model = Qwen3(ARCH, rngs=nnx.Rngs(1))
    tokens = jnp.asarray(RNG.integers(0, ARCH.vocab, (2, 128)), jnp.int32)
    valid = jnp.arange(128)[None, :] >= jnp.asarray([[0], [40]])
    positions = jnp.maximum(jnp.arange(128)[None, :] - jnp.asarray([[0], [40]]), 0)
    want, _ = model(tokens, positions, kv_valid_BxS=valid)
    got, _ = model(tokens, positions, kv_valid_BxS=valid,
                   ops=ModelOps(causal_attention=SplashCausal(interpret=True)))
    np.testing.assert_allclose(jnp.where(valid[..., None], got, 0),
                               jnp.where(valid[..., None], want, 0), atol=1e-4)


def test_the_kernel_built_inside_one_program_serves_the_next():
    # The full step traced first, then the LoRA step: the second program reuses the kernel
    # the first built under remat (a kernel holding the first trace's values would leak).
    from locojax.kernels import tpu_attention

    q = jnp.ones((1, 128, 2, 128))
    k = jnp.ones((1, 128, 1, 128))
    valid = jnp.ones((1, 128), bool)

    def loss(scale):
        return lambda q: jax.checkpoint(lambda q: scale * tpu_attention.causal_attention(
            q, k, k, valid, interpret=True))(q).sum()

    for scale in (1.0, 2.0):
        assert jax.jit(jax.grad(loss(scale)))(q).shape == q.shape

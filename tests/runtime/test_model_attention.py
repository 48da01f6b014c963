"""Training attention: query blocks give the plain masked softmax, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np

from locojax.model.attention import training_attention
from locojax.model.ops import XLA_OPS
from locojax.model.ops import masked_attention as plain_attention


def test_query_blocks_equal_the_plain_softmax():
    b, length, h, kv, hd = 2, 70, 4, 2, 16
    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(ks[0], (b, length, h, hd))
    k, v = (jax.random.normal(x, (b, length, kv, hd)) for x in ks[1:3])
    valid = jnp.arange(length)[None, :] >= jnp.asarray([[3], [10]])  # left padding
    mask = (jnp.arange(length)[:, None] >= jnp.arange(length)[None, :])[None] & valid[:, None]
    ct = jax.random.normal(ks[3], q.shape)

    def blocked(q, k, v):  # 70 queries in blocks of 16: five blocks, the last one padded
        return training_attention(plain_attention, q, k, v, mask, block=16)

    np.testing.assert_allclose(blocked(q, k, v), plain_attention(q, k, v, mask), atol=2e-6)
    grads = [jax.jit(jax.grad(lambda *x, f=f: (f(*x) * ct).sum(), (0, 1, 2)))(q, k, v)
             for f in (blocked, lambda *x: plain_attention(*x, mask))]
    for got, want in zip(*grads, strict=True):
        np.testing.assert_allclose(got, want, atol=5e-6)


def test_the_default_ops_attend_in_query_blocks():
    """XLA_OPS.attention (the model's no-cache path: training, scoring) is the blocked form."""
    b, length, h, kv, hd = 1, 600, 2, 1, 8  # 600 queries > one 512-query block
    ks = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(ks[0], (b, length, h, hd))
    k, v = (jax.random.normal(x, (b, length, kv, hd)) for x in ks[1:])
    mask = (jnp.arange(length)[:, None] >= jnp.arange(length)[None, :])[None]
    got = jax.jit(XLA_OPS.attention)(q, k, v, mask)
    np.testing.assert_allclose(got, plain_attention(q, k, v, mask), atol=2e-6)
    hlo = jax.jit(XLA_OPS.attention).lower(q, k, v, mask).as_text()
    assert "while" in hlo  # the blocks run in a loop (lax.map), not as one 600 x 600 softmax

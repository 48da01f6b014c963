"""Training attention: query blocks give the plain masked softmax, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np

from locojax.model.attention import training_attention
from locojax.model.layers import plain_attention


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

"""The training forward's attention: cuDNN's fused kernel on GPU, query blocks elsewhere.

    training_attention(plain, q_BxLxHxhd, k_BxSxKxhd, v_BxSxKxhd, mask_BxLxS) -> ctx_BxLxHxhd

`XLA_OPS.attention` (model/ops.py) is this with `plain` = `ops.masked_attention`, the
model's own masked softmax in the same layout and conventions (query head
h = k * G + g reads kv head k, scale hd^-0.5, mask True where query i may read slot j).
Neither path holds fp32 L x S scores for a whole row:
- a GPU with 16-bit compute: `jax.nn.dot_product_attention(implementation="cudnn")`, flash
  attention (no scores in memory, the causal half skipped); `plain` when cuDNN refuses the
  shapes at trace time;
- otherwise (CPU, TPU, fp32): `plain` over blocks of QUERY_BLOCK queries in turn, each block
  a `jax.checkpoint`, so one block's H x QUERY_BLOCK x S scores (and their gradients) are
  live at a time. At L <= QUERY_BLOCK that is `plain` itself. (jax.nn.dot_product_attention's
  XLA path holds the same scores and ran ~1.7x slower than `plain` on this CPU.)
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

QUERY_BLOCK = 512
"""Queries per block of the blocked path (the compiler's memory model uses the same)."""

Attention = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


def _blocked(plain: Attention, q_BxLxHxhd, k_BxSxKxhd, v_BxSxKxhd, mask_BxLxS, block: int):
    b, length, h, hd = q_BxLxHxhd.shape
    n = -(-length // block)
    pad = n * block - length
    q = jnp.pad(q_BxLxHxhd, ((0, 0), (0, pad), (0, 0), (0, 0)))
    mask = jnp.pad(mask_BxLxS, ((0, 0), (0, pad), (0, 0)))
    q_nxBxQxHxhd = jnp.moveaxis(q.reshape(b, n, block, h, hd), 1, 0)
    mask_nxBxQxS = jnp.moveaxis(mask.reshape(b, n, block, -1), 1, 0)

    @jax.checkpoint
    def one(q_and_mask):
        return plain(q_and_mask[0], k_BxSxKxhd, v_BxSxKxhd, q_and_mask[1])

    ctx_nxBxQxHxhd = jax.lax.map(one, (q_nxBxQxHxhd, mask_nxBxQxS))
    return jnp.moveaxis(ctx_nxBxQxHxhd, 0, 1).reshape(b, n * block, h, hd)[:, :length]


def _cudnn_applies(dtype) -> bool:
    return jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)


def training_attention(plain: Attention, q_BxLxHxhd, k_BxSxKxhd, v_BxSxKxhd, mask_BxLxS,
                       block: int = QUERY_BLOCK) -> jax.Array:
    """Masked softmax attention without a cache (module docstring)."""
    if _cudnn_applies(q_BxLxHxhd.dtype):
        dt = q_BxLxHxhd.dtype
        try:
            return jax.nn.dot_product_attention(
                q_BxLxHxhd, k_BxSxKxhd.astype(dt), v_BxSxKxhd.astype(dt),
                mask=mask_BxLxS[:, None].astype(bool), is_causal=True, implementation="cudnn")
        except (ValueError, NotImplementedError, RuntimeError):
            pass  # shapes or versions cuDNN does not take
    if q_BxLxHxhd.shape[1] <= block:
        return plain(q_BxLxHxhd, k_BxSxKxhd, v_BxSxKxhd, mask_BxLxS)
    return _blocked(plain, q_BxLxHxhd, k_BxSxKxhd, v_BxSxKxhd, mask_BxLxS, block)

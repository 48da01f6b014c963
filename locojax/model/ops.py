"""What the model computes with, injected by its caller: weight matmuls and attention.

    ModelOps(matmul, attention, cached_attention)   frozen, hashable: a static jit argument
    ModelOps() is XLA's: jnp.tensordot and a masked softmax (the default everywhere; without a
        cache in query blocks, or cuDNN's fused kernel on GPU: model/attention.py)

The model multiplies by every layer weight through `ops.matmul(x, w, axes)` and attends
through `ops.attention` (no cache: training, scoring) or `ops.cached_attention` (a KV cache:
prefill, decode), or `ops.stacked_attention` where it is given and a stacked cache knows
each row's live slots (the TPU decode kernel). A caller swaps in its own (the rollout engine: CPU kernels; training: a
fused attention) without the model knowing which runs.

`w` is the weight as the model stores it, or whatever the caller made of it before the call
(the rollout engine's CPU backend packs matrices into panels once per generation): the model
reads a weight's value and hands it to `matmul` untouched, never looks inside.

Attention conventions: q_BxLxHxhd with query head h = k * G + g reading kv head k (G = H / K
heads per kv head); mask_BxLxS True where query i may read slot j; scores scaled by hd^-0.5;
the result ctx_BxLxHxhd in q's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from locojax.model.attention import training_attention

MASKED = -1e30
"""Score of a masked slot: large and finite, so a row with every slot masked stays finite."""

MatmulFn = Callable[[jax.Array, Any, int], jax.Array]
"""(x, w, axes) -> x's last `axes` dims contracted with w's first `axes` (jnp.tensordot)."""
AttentionFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]
"""(q_BxLxHxhd, k_BxSxKxhd, v_BxSxKxhd, mask_BxLxS) -> ctx_BxLxHxhd: no cache, keys and values
fresh from the projections (jax.nn.dot_product_attention's layout)."""
StackedAttentionFn = Callable[..., jax.Array]
"""(q_Bx1xHxhd, k_all_NxBxKxSxhd, v_all_NxBxKxSxhd, layer, end, live_B) -> ctx_Bx1xHxhd: one
query per row over layer `layer` of every layer's cache, read in place; row b reads the
`live_B[b]` slots ending at slot `end` (mod S), wrapping (`KVCache.live_B`)."""
CausalAttentionFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]
"""(q_BxLxHxhd, k_BxLxKxhd, v_BxLxKxhd, valid_BxL) -> ctx_BxLxHxhd: no cache, query i reading
the valid keys j <= i (`qwen3.attention_mask`'s rule) without a dense mask."""
CachedAttentionFn = Callable[..., jax.Array]
"""(q_BxLxHxhd, keys, values_BxKxSxhd, mask_BxLxS, *, keys_transposed) -> ctx_BxLxHxhd: keys
k_BxKxSxhd (a stacked `KVCache` layer) or, with `keys_transposed`, k_BxKxhdxS (`LayerKVCache`)."""


def tensordot(x: jax.Array, w: jax.Array, axes: int) -> jax.Array:
    """XLA's weight matmul: x's last `axes` dims against w's first `axes`; a weight that
    multiplies itself (`locojax.model.lora.LoraWeight`: x W + s (x A) B) does so."""
    if hasattr(w, "contract"):
        return w.contract(x, axes)
    return jnp.tensordot(x, w, axes)


def attend(q_BxLxHxhd, keys, v_BxKxSxhd, mask_BxLxS, keys_transposed=False) -> jax.Array:
    """Masked softmax attention -> BxKxGxLxhd, query head h = k*G + g reading kv head k.

    `keys` is k_BxKxSxhd, or k_BxKxhdxS with `keys_transposed`. Batch axes (b, k) lead
    every operand, so the dots read the cache as stored.
    """
    b, length, h, hd = q_BxLxHxhd.shape
    k = keys.shape[1]
    g = h // k
    q_BxKxGLxhd = q_BxLxHxhd.reshape(b, length, k, g, hd).transpose(0, 2, 3, 1, 4)
    q_BxKxGLxhd = q_BxKxGLxhd.reshape(b, k, g * length, hd)
    scores = jnp.einsum(
        "bkqd,bkds->bkqs" if keys_transposed else "bkqd,bksd->bkqs", q_BxKxGLxhd, keys,
        preferred_element_type=jnp.float32,
    ).reshape(b, k, g, length, -1)
    scores = jnp.where(mask_BxLxS[:, None, None], scores * hd**-0.5, MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BxKxSxhd.dtype)
    probs_BxKxGLxS = probs.reshape(b, k, g * length, -1)
    out_BxKxGLxhd = jnp.einsum("bkqs,bksd->bkqd", probs_BxKxGLxS, v_BxKxSxhd)
    return out_BxKxGLxhd.reshape(b, k, g, length, hd)


def heads_last(ctx_BxKxGxLxhd: jax.Array) -> jax.Array:
    """BxKxGxLxhd -> BxLxHxhd (h = k * G + g)."""
    b, k, g, length, hd = ctx_BxKxGxLxhd.shape
    return ctx_BxKxGxLxhd.transpose(0, 3, 1, 2, 4).reshape(b, length, k * g, hd)


def masked_attention(q_BxLxHxhd, k_BxSxKxhd, v_BxSxKxhd, mask_BxLxS) -> jax.Array:
    """XLA's attention without a cache (`AttentionFn`)."""
    keys, values = (x.transpose(0, 2, 1, 3).astype(q_BxLxHxhd.dtype)
                    for x in (k_BxSxKxhd, v_BxSxKxhd))
    return heads_last(attend(q_BxLxHxhd, keys, values, mask_BxLxS))


def blocked_masked_attention(q_BxLxHxhd, k_BxSxKxhd, v_BxSxKxhd, mask_BxLxS) -> jax.Array:
    """XLA's attention without a cache as training runs it (`AttentionFn`): cuDNN's fused
    kernel on a GPU in 16-bit, else `masked_attention` over query blocks
    (`locojax.model.attention.training_attention`), never fp32 L x S scores for a whole row."""
    return training_attention(masked_attention, q_BxLxHxhd, k_BxSxKxhd, v_BxSxKxhd, mask_BxLxS)


def cached_masked_attention(q_BxLxHxhd, keys, values_BxKxSxhd, mask_BxLxS, *,
                            keys_transposed: bool) -> jax.Array:
    """XLA's attention over a KV cache (`CachedAttentionFn`); reads every slot."""
    dt = q_BxLxHxhd.dtype
    return heads_last(attend(q_BxLxHxhd, keys.astype(dt), values_BxKxSxhd.astype(dt), mask_BxLxS,
                             keys_transposed=keys_transposed))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ValidTokens:
    """The causal mask over a row's valid tokens, not materialised: what the model hands
    `ModelOps.causal_attention` in place of a dense BxLxS mask."""

    valid_BxL: jax.Array


@dataclass(frozen=True)
class ModelOps:
    """The model's weight matmul and attention (see the module docstring); XLA's by default."""

    matmul: MatmulFn = tensordot
    attention: AttentionFn = blocked_masked_attention
    cached_attention: CachedAttentionFn = cached_masked_attention
    causal_attention: CausalAttentionFn | None = None
    """Used without a cache where the mask is the causal rule over valid tokens
    (`ValidTokens`; the TPU's splash attention); None: `attention` over the dense mask."""
    stacked_attention: StackedAttentionFn | None = None
    """Used for a one-token step over a stacked cache whose rows' live slots are known
    (`KVCache.live_B`); None: the layer's cache is sliced out for `cached_attention`."""


XLA_OPS = ModelOps()
"""XLA's ops: what every caller gets unless it says otherwise."""

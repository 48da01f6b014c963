"""Building blocks of one Qwen3 decoder layer: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Each parameter is an `nnx.Param` whose `out_sharding` metadata holds its logical axis names
(`compiler.axes.LogicalAxis` values); the compiler maps them to mesh axes. Eager sharding is
off so a model builds without a mesh.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from math import prod

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from compiler.axes import LogicalAxis as A
from locojax.model import cpu_kernels
from locojax.model.arch import ModelArch

# Large finite instead of -inf so a row with every key masked (a padding query) stays finite.
_MASKED = -1e30


def param(value: jax.Array, axes: Sequence[A]) -> nnx.Param:
    """A parameter holding `value`, tagged with its logical axes."""
    assert value.ndim == len(axes), (value.shape, axes)
    return nnx.Param(value, out_sharding=tuple(a.value for a in axes), eager_sharding=False)


@partial(jax.jit, static_argnums=(1, 2))
def fan_in_normals(key, shapes_and_fan_ins, dtype) -> tuple[jax.Array, ...]:
    """Independent N(0, 1/fan_in) arrays of the given shapes, cut from one random draw.

    One jitted draw per module: XLA's CPU compile time grows by ~0.5 s per threefry call,
    and eager construction would otherwise compile every small op separately.
    """
    sizes = [prod(shape) for shape, _ in shapes_and_fan_ins]
    if len(sizes) == 1:  # drawn in its own shape, which partitions best when init is sharded
        pieces = [jax.random.normal(key, shapes_and_fan_ins[0][0], jnp.float32)]
    else:
        z = jax.random.normal(key, (sum(sizes),), jnp.float32)
        pieces = jnp.split(z, np.cumsum(sizes)[:-1])
    return tuple(
        (piece.reshape(shape) * fan_in**-0.5).astype(dtype)
        for piece, (shape, fan_in) in zip(pieces, shapes_and_fan_ins, strict=True)
    )


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """Normalise the last axis by its root mean square in fp32, then scale (HF order)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return scale * normed.astype(x.dtype)


class RMSNorm(nnx.Module):
    """RMSNorm over a last axis of `width` (logical axis `axis`)."""

    def __init__(self, width: int, axis: A, eps: float, dtype):
        self.scale = param(jnp.ones((width,), dtype), (axis,))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale[...], self.eps)


def rope_cos_sin(positions_BxL: jax.Array, head_dim: int, theta: float):
    """fp32 cos and sin tables of shape BxLx(head_dim/2) for the given positions."""
    exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    angles_BxLxR = positions_BxL.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(angles_BxLxR), jnp.sin(angles_BxLxR)


def apply_rope(x_BxLxHxhd: jax.Array, cos_BxLxR: jax.Array, sin_BxLxR: jax.Array) -> jax.Array:
    """Rotate pairs (i, i + hd/2): the HF `rotate_half` convention."""
    x32 = x_BxLxHxhd.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    cos, sin = cos_BxLxR[:, :, None, :], sin_BxLxR[:, :, None, :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BxLxHxhd.dtype)


def attend(q_BxLxHxhd, keys, v_BxKxSxhd, mask_BxLxS, keys_transposed=False) -> jax.Array:
    """Masked softmax attention -> BxKxGxLxhd, query head h = k*G + g reading kv head k.

    `keys` is k_BxKxSxhd, or k_BxKxhdxS with `keys_transposed`. Batch axes (b, k) lead
    every operand, so the dots read the cache as stored, and the result stays in that order
    so the output projection reads its weight untransposed.
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
    scores = jnp.where(mask_BxLxS[:, None, None], scores * hd**-0.5, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BxKxSxhd.dtype)
    probs_BxKxGLxS = probs.reshape(b, k, g * length, -1)
    out_BxKxGLxhd = jnp.einsum("bkqs,bksd->bkqd", probs_BxKxGLxS, v_BxKxSxhd)
    return out_BxKxGLxhd.reshape(b, k, g, length, hd)


class Attention(nnx.Module):
    """Grouped-query self-attention with per-head QK-norm and RoPE."""

    def __init__(self, arch: ModelArch, *, rngs: nnx.Rngs):
        d, h, k, hd, dt = (
            arch.hidden,
            arch.num_heads,
            arch.num_kv_heads,
            arch.head_dim,
            arch.jnp_dtype,
        )
        q, k_, v, o = fan_in_normals(
            rngs.params(),
            (((d, h, hd), d), ((d, k, hd), d), ((d, k, hd), d), ((h, hd, d), h * hd)),
            dt,
        )
        self.q_proj = param(q, (A.EMBED, A.HEADS, A.HEAD_DIM))
        self.k_proj = param(k_, (A.EMBED, A.KV_HEADS, A.HEAD_DIM))
        self.v_proj = param(v, (A.EMBED, A.KV_HEADS, A.HEAD_DIM))
        self.o_proj = param(o, (A.HEADS, A.HEAD_DIM, A.EMBED))
        self.head_dim = hd
        if arch.qk_norm:
            self.q_norm = RMSNorm(hd, A.HEAD_DIM, arch.norm_eps, dt)
            self.k_norm = RMSNorm(hd, A.HEAD_DIM, arch.norm_eps, dt)
        else:
            self.q_norm = self.k_norm = None

    def _project(self, x_BxLxD: jax.Array, w) -> jax.Array:
        """x @ a Dx(heads)x(hd) weight -> BxLx(heads)x(hd). A 2-D stand-in for the weight (the
        rollout engine's `cpu_kernels.PanelWeight`, a Dx(heads*hd) matrix) is multiplied as one."""
        if w.ndim == 2:
            b, length, _ = x_BxLxD.shape
            return (x_BxLxD @ w).reshape(b, length, -1, self.head_dim)
        return jnp.einsum("bld,dhe->blhe", x_BxLxD, w)

    def __call__(self, x_BxLxD, cos_BxLxR, sin_BxLxR, mask_BxLxS, kv=None, cpu_attention=False):
        """Attend; `kv` = (k_all, v_all, layer, end) writes this layer's slots at `end`.

        `k_all`/`v_all` are either every layer's cache (NxBxKxSxhd, this layer at index
        `layer`) or this layer's own (`layer` None: keys BxKxhdxS, transposed as in
        `LayerKVCache`, values BxKxSxhd). Returns (out_BxLxD, (k_all, v_all) or None).
        `cpu_attention`: a one-token step on this layer's own cache attends through
        `cpu_kernels.decode_attention` (reads only slots up to the last valid one).
        """
        q, k, v = (self._project(x_BxLxD, w[...]) for w in (self.q_proj, self.k_proj,
                                                              self.v_proj))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos_BxLxR, sin_BxLxR), apply_rope(k, cos_BxLxR, sin_BxLxR)
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # BxKxLxhd, the cache layout
        if kv is None:
            keys, values, new_kv = k, v, None
        else:
            k_all, v_all, layer, end = kv
            zero = jnp.zeros((), jnp.int32)
            if layer is None:  # this layer's own cache: written and read in place
                k_BxKxhdxL = k.transpose(0, 1, 3, 2).astype(k_all.dtype)
                keys = k_all = jax.lax.dynamic_update_slice(k_all, k_BxKxhdxL,
                                                            (zero, zero, zero, end))
                at = (zero, zero, end, zero)
                values = v_all = jax.lax.dynamic_update_slice(v_all, v.astype(v_all.dtype), at)
            else:
                at = (layer, zero, zero, end, zero)
                k_all = jax.lax.dynamic_update_slice(k_all, k[None].astype(k_all.dtype), at)
                v_all = jax.lax.dynamic_update_slice(v_all, v[None].astype(v_all.dtype), at)
                keys = jax.lax.dynamic_index_in_dim(k_all, layer, keepdims=False)
                values = jax.lax.dynamic_index_in_dim(v_all, layer, keepdims=False)
            new_kv = (k_all, v_all)
        own_cache = kv is not None and kv[2] is None
        if cpu_attention and own_cache and q.shape[1] == 1:
            b, _, h, hd = q.shape
            kv_heads = keys.shape[1]
            ctx_BxKxGxLxhd = cpu_kernels.decode_attention(
                q.reshape(b, kv_heads, h // kv_heads, hd), keys, values, mask_BxLxS[:, 0],
                hd**-0.5)[:, :, :, None].astype(q.dtype)
        else:
            ctx_BxKxGxLxhd = attend(q, keys.astype(q.dtype), values.astype(q.dtype), mask_BxLxS,
                                    keys_transposed=own_cache)
        b, kv_heads, g, length, hd = ctx_BxKxGxLxhd.shape
        width = kv_heads * g * hd
        # One plain matmul over (h, hd) in the weight's stored order: no weight transpose.
        ctx_BxLxHhd = ctx_BxKxGxLxhd.transpose(0, 3, 1, 2, 4).reshape(b, length, width)
        o_HhdxD = self.o_proj[...].reshape(width, -1)
        return ctx_BxLxHhd @ o_HhdxD, new_kv


class MLP(nnx.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, arch: ModelArch, *, rngs: nnx.Rngs):
        d, f, dt = arch.hidden, arch.ffn, arch.jnp_dtype
        gate, up, down = fan_in_normals(rngs.params(), (((d, f), d), ((d, f), d), ((f, d), f)), dt)
        self.gate_proj = param(gate, (A.EMBED, A.MLP))
        self.up_proj = param(up, (A.EMBED, A.MLP))
        self.down_proj = param(down, (A.MLP, A.EMBED))

    def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
        gate_BxLxF = x_BxLxD @ self.gate_proj[...]
        up_BxLxF = x_BxLxD @ self.up_proj[...]
        return (jax.nn.silu(gate_BxLxF) * up_BxLxF) @ self.down_proj[...]

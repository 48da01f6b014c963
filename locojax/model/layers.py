"""Building blocks of one decoder layer: RMSNorm (w or Gemma's 1 + w), RoPE (with Hugging Face's
scalings; a second base for sliding layers), grouped-query attention (biases, QK-norm and the
query scale by family), the gated MLP (SwiGLU or GeGLU).

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
from locojax.model.arch import ModelArch
from locojax.model.ops import XLA_OPS, ModelOps, ValidTokens
from locojax.model.rope import UNSCALED, RopeKind, RopeScaling, rope_frequencies

MATMUL_WEIGHTS = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2, "gate_proj": 1,
                  "up_proj": 1, "down_proj": 1}
"""Layer weights multiplied through `ops.matmul(x, w, axes)`, each with its `axes` (how many
leading dims the product contracts): what a backend that prepares weights must know."""


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


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, offset: float = 0.0) -> jax.Array:
    """Normalise the last axis by its root mean square in fp32, then scale (HF order): by
    `scale` in x's dtype, or with an `offset` (Gemma's 1 + w) by offset + scale in fp32 before
    the cast back (transformers' `Gemma3RMSNorm`)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if offset:
        return (normed * (offset + scale.astype(jnp.float32))).astype(x.dtype)
    return scale.astype(x.dtype) * normed.astype(x.dtype)


class RMSNorm(nnx.Module):
    """RMSNorm over a last axis of `width` (logical axis `axis`), multiplying by
    offset + w with w built at 1 - offset (the identity at initialisation)."""

    def __init__(self, width: int, axis: A, eps: float, dtype, offset: float = 0.0):
        self.scale = param(jnp.full((width,), 1.0 - offset, dtype), (axis,))
        self.eps = eps
        self.offset = offset

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale[...], self.eps, self.offset)


def arch_norm(arch: ModelArch, width: int, axis: A) -> RMSNorm:
    """An RMSNorm in `arch`'s family form (`Family.norm_offset`)."""
    return RMSNorm(width, axis, arch.norm_eps, arch.jnp_param_dtype, arch.options.norm_offset)


def rope_cos_sin(positions_BxL: jax.Array, head_dim: int, theta: float,
                 scaling: RopeScaling = UNSCALED) -> tuple[jax.Array, jax.Array]:
    """fp32 cos and sin tables of shape BxLx(head_dim/2) for the given positions.

    `scaling` rescales the frequencies and multiplies both tables by its attention scale
    (`rope.rope_frequencies`, as transformers' `cos * attention_scaling`). The default kind
    keeps the float32 formula computed here, bit for bit what it always was.
    """
    if scaling.kind is RopeKind.default:
        exponents_R = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
        inv_freq_R, attention_scale = 1.0 / (theta**exponents_R), 1.0
    else:
        inv_freq_np_R, attention_scale = rope_frequencies(head_dim, theta, scaling)
        inv_freq_R = jnp.asarray(inv_freq_np_R)
    angles_BxLxR = positions_BxL.astype(jnp.float32)[..., None] * inv_freq_R
    cos_BxLxR, sin_BxLxR = jnp.cos(angles_BxLxR), jnp.sin(angles_BxLxR)
    if attention_scale == 1.0:  # every kind but yarn: no extra op in the program
        return cos_BxLxR, sin_BxLxR
    return cos_BxLxR * attention_scale, sin_BxLxR * attention_scale


def rope_tables(positions_BxL: jax.Array, arch: ModelArch) -> tuple[jax.Array, jax.Array]:
    """`arch`'s fp32 RoPE tables (cos, sin) of the positions: BxLxR, or, when `arch` has
    sliding layers, BxLxRx2 with the full layers' (`rope_theta`, `rope_scaling`) at [..., 0]
    and the sliding layers' (`rope_local_theta`, unscaled) at [..., 1]. Indexing their leading
    axes (e.g. a table of every position, read at each row's) keeps the trailing kind axis."""
    full = rope_cos_sin(positions_BxL, arch.head_dim, arch.rope_theta, arch.rope_scaling)
    if not arch.has_sliding:
        return full
    local = rope_cos_sin(positions_BxL, arch.head_dim, arch.rope_local_theta)
    return tuple(jnp.stack(pair, axis=-1) for pair in zip(full, local, strict=True))


def apply_rope(x_BxLxHxhd: jax.Array, cos_BxLxR: jax.Array, sin_BxLxR: jax.Array) -> jax.Array:
    """Rotate pairs (i, i + hd/2): the HF `rotate_half` convention."""
    x32 = x_BxLxHxhd.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    cos, sin = cos_BxLxR[:, :, None, :], sin_BxLxR[:, :, None, :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BxLxHxhd.dtype)


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE, optional q/k/v biases (Qwen2) and optional
    per-head QK-norm (Qwen3)."""

    def __init__(self, arch: ModelArch, *, rngs: nnx.Rngs):
        d, h, k, hd, dt = (
            arch.hidden,
            arch.num_heads,
            arch.num_kv_heads,
            arch.head_dim,
            arch.jnp_param_dtype,
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
        if arch.qkv_bias:  # zeros, as Hugging Face initialises a Linear's bias
            self.q_bias = param(jnp.zeros((h, hd), dt), (A.HEADS, A.HEAD_DIM))
            self.k_bias = param(jnp.zeros((k, hd), dt), (A.KV_HEADS, A.HEAD_DIM))
            self.v_bias = param(jnp.zeros((k, hd), dt), (A.KV_HEADS, A.HEAD_DIM))
        else:
            self.q_bias = self.k_bias = self.v_bias = None
        if arch.qk_norm:
            self.q_norm = arch_norm(arch, hd, A.HEAD_DIM)
            self.k_norm = arch_norm(arch, hd, A.HEAD_DIM)
        else:
            self.q_norm = self.k_norm = None
        self.query_scale = arch.query_scale

    def __call__(self, x_BxLxD, cos_BxLxR, sin_BxLxR, mask_BxLxS, kv=None,
                 ops: ModelOps = XLA_OPS):
        """Attend; `kv` = (k_all, v_all, layer, end, live_B) writes this layer's slots at `end`
        modulo its cache's columns (a sliding layer's ring may be narrower than the other
        layers').

        `k_all`/`v_all` are either every layer's cache (NxBxKxSxhd, this layer at index
        `layer`) or this layer's own (`layer` None: keys BxKxhdxS, transposed as in
        `LayerKVCache`, values BxKxSxhd). `live_B` (or None): each row's live slots
        (`KVCache.live_B`), read by `ops.stacked_attention` where the ops have one. Returns
        (out_BxLxD, (k_all, v_all) or None). Weight matmuls and attention go through `ops`
        (`locojax.model.ops`).
        """
        q, k, v = (ops.matmul(x_BxLxD, w.get_value(), 1) for w in (self.q_proj, self.k_proj,
                                                                    self.v_proj))
        if self.q_bias is not None:
            q, k, v = (x + b.get_value().astype(x.dtype)
                       for x, b in ((q, self.q_bias), (k, self.k_bias), (v, self.v_bias)))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos_BxLxR, sin_BxLxR), apply_rope(k, cos_BxLxR, sin_BxLxR)
        if self.query_scale != 1.0:  # scores by query_pre_attn_scalar^-0.5, not hd^-0.5
            q = q * jnp.asarray(self.query_scale, q.dtype)
        if kv is None:
            ctx = (ops.causal_attention(q, k, v, mask_BxLxS.valid_BxL)
                   if isinstance(mask_BxLxS, ValidTokens) else ops.attention(q, k, v, mask_BxLxS))
            return ops.matmul(ctx, self.o_proj.get_value(), 2), None
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # BxKxLxhd, the cache layout
        k_all, v_all, layer, end, live_B = kv
        end = end % k_all.shape[3]  # the columns' axis of either layout
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
            if live_B is not None and ops.stacked_attention is not None:
                ctx_BxLxHxhd = ops.stacked_attention(q, k_all, v_all, layer, end, live_B)
                return ops.matmul(ctx_BxLxHxhd, self.o_proj.get_value(), 2), (k_all, v_all)
            keys = jax.lax.dynamic_index_in_dim(k_all, layer, keepdims=False)
            values = jax.lax.dynamic_index_in_dim(v_all, layer, keepdims=False)
        ctx_BxLxHxhd = ops.cached_attention(q, keys, values, mask_BxLxS,
                                            keys_transposed=layer is None)
        # One matmul over (h, hd) in the weight's stored order: no weight transpose.
        return ops.matmul(ctx_BxLxHxhd, self.o_proj.get_value(), 2), (k_all, v_all)


ACTIVATIONS = {"silu": jax.nn.silu, "gelu_pytorch_tanh": partial(jax.nn.gelu, approximate=True)}
"""The gated MLP's activation by config.json's name (`Family.activation`): SwiGLU, GeGLU."""


class MLP(nnx.Module):
    """Gated feed-forward: down(act(gate(x)) * up(x)), act by family (SwiGLU: silu, GeGLU:
    tanh-approximated gelu)."""

    def __init__(self, arch: ModelArch, *, rngs: nnx.Rngs):
        d, f, dt = arch.hidden, arch.ffn, arch.jnp_param_dtype
        gate, up, down = fan_in_normals(rngs.params(), (((d, f), d), ((d, f), d), ((f, d), f)), dt)
        self.gate_proj = param(gate, (A.EMBED, A.MLP))
        self.up_proj = param(up, (A.EMBED, A.MLP))
        self.down_proj = param(down, (A.MLP, A.EMBED))
        self.activation = ACTIVATIONS[arch.options.activation]

    def __call__(self, x_BxLxD: jax.Array, ops: ModelOps = XLA_OPS) -> jax.Array:
        gate_BxLxF = ops.matmul(x_BxLxD, self.gate_proj.get_value(), 1)
        up_BxLxF = ops.matmul(x_BxLxD, self.up_proj.get_value(), 1)
        return ops.matmul(self.activation(gate_BxLxF) * up_BxLxF, self.down_proj.get_value(), 1)

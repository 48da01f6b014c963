"""The Qwen3 decoder: embedding, N layers stacked on a leading `layers` axis and scanned, head.
Its family's options (`ModelArch.options`) make it Qwen2, Llama, Gemma 3 (four norms per
layer, a scaled embedding; sliding layers read their own mask and RoPE tables, picked per
layer by a flag scanned beside the stacked weights) or SmolLM3 (NoPE layers: a second flag
turns their RoPE tables into the identity).

Parameter paths, shapes and logical axes equal `compiler.params.param_table` (a test checks).
"""

from __future__ import annotations

from functools import partial

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Sharding

from compiler.axes import LogicalAxis as A
from locojax.model.arch import ModelArch
from locojax.model.kv_cache import KVCache, LayerKVCache
from locojax.model.layers import MLP, Attention, arch_norm, fan_in_normals, param, rope_tables
from locojax.model.ops import XLA_OPS, ModelOps, ValidTokens


class Block(nnx.Module):
    """One pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x)); with the family's
    sandwich norms (Gemma) x + post_norm(attn(norm(x))), then x + post_mlp(mlp(norm(x)))."""

    def __init__(self, arch: ModelArch, *, rngs: nnx.Rngs):
        self.attn_norm = arch_norm(arch, arch.hidden, A.NORM)
        self.attn = Attention(arch, rngs=rngs)
        self.mlp_norm = arch_norm(arch, arch.hidden, A.NORM)
        self.mlp = MLP(arch, rngs=rngs)
        sandwich = arch.options.sandwich_norms
        self.attn_post_norm = arch_norm(arch, arch.hidden, A.NORM) if sandwich else None
        self.mlp_post_norm = arch_norm(arch, arch.hidden, A.NORM) if sandwich else None

    def __call__(self, x_BxLxD, cos_BxLxR, sin_BxLxR, mask_BxLxS, kv=None,
                 ops: ModelOps = XLA_OPS):
        """Apply the layer; `kv` and `ops` as in `Attention.__call__`."""
        attn_BxLxD, kv = self.attn(self.attn_norm(x_BxLxD), cos_BxLxR, sin_BxLxR, mask_BxLxS, kv,
                                   ops)
        if self.attn_post_norm is not None:
            attn_BxLxD = self.attn_post_norm(attn_BxLxD)
        x_BxLxD = x_BxLxD + attn_BxLxD
        mlp_BxLxD = self.mlp(self.mlp_norm(x_BxLxD), ops)
        if self.mlp_post_norm is not None:
            mlp_BxLxD = self.mlp_post_norm(mlp_BxLxD)
        return x_BxLxD + mlp_BxLxD, kv


class Embed(nnx.Module):
    """Token embedding table VxD."""

    def __init__(self, arch: ModelArch, *, rngs: nnx.Rngs):
        shape = (arch.vocab, arch.hidden)
        (table,) = fan_in_normals(rngs.params(), ((shape, arch.hidden),), arch.jnp_param_dtype)
        self.embedding = param(table, (A.VOCAB, A.EMBED))
        self.dtype = arch.jnp_dtype
        self.scale = arch.hidden**0.5 if arch.options.embed_scale else None

    def __call__(self, tokens_BxL: jax.Array) -> jax.Array:
        """Rows of the table, in the compute dtype (times sqrt(D) in it, for a family that
        scales its embedding, as transformers' Gemma does)."""
        x_BxLxD = jnp.take(self.embedding[...], tokens_BxL, axis=0).astype(self.dtype)
        if self.scale is None:
            return x_BxLxD
        return x_BxLxD * jnp.asarray(self.scale, self.dtype)


class LMHead(nnx.Module):
    """Untied output projection DxV."""

    def __init__(self, arch: ModelArch, *, rngs: nnx.Rngs):
        shape = (arch.hidden, arch.vocab)
        (kernel,) = fan_in_normals(rngs.params(), ((shape, arch.hidden),), arch.jnp_param_dtype)
        self.kernel = param(kernel, (A.EMBED, A.VOCAB))


def _stacked_blocks(arch: ModelArch, rngs: nnx.Rngs) -> Block:
    """N blocks whose parameters are stacked on a leading `layers` axis."""

    @nnx.split_rngs(splits=arch.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: A.LAYERS.value})
    def make(rngs: nnx.Rngs) -> Block:
        return Block(arch, rngs=rngs)

    return make(rngs)


def attention_mask(
    batch: int, length: int, slots: int, end, kv_valid_BxS: jax.Array | None
) -> jax.Array:
    """Query i (at slot end + i) sees slot j iff j <= end + i and slot j is valid."""
    q_slot_L = end + jnp.arange(length, dtype=jnp.int32)
    mask_LxS = jnp.arange(slots, dtype=jnp.int32)[None, :] <= q_slot_L[:, None]
    mask_BxLxS = jnp.broadcast_to(mask_LxS, (batch, length, slots))
    if kv_valid_BxS is not None:
        mask_BxLxS = mask_BxLxS & kv_valid_BxS[:, None, :].astype(bool)
    return mask_BxLxS


def window_mask(mask_BxLxS: jax.Array, end, window: int) -> jax.Array:
    """`mask_BxLxS` (slot order = token order, query i at slot end + i) limited to a sliding
    layer's window: query i reads slot j only if end + i - j < window. Left padding shifts a
    row's slots and positions alike, so slot distance is token distance."""
    length, slots = mask_BxLxS.shape[1:]
    q_slot_L = end + jnp.arange(length, dtype=jnp.int32)
    near_LxS = q_slot_L[:, None] - jnp.arange(slots, dtype=jnp.int32)[None, :] < window
    return mask_BxLxS & near_LxS[None]


def layer_inputs(flags, rope, masks):
    """(cos, sin, mask) of one layer; `flags` = (sliding, rotary), each a Python or traced bool.
    `masks` = (full, window); `window` None (no sliding layers): the tables and the full mask
    as given. Else `sliding` picks the sliding layers' RoPE tables (`rope_tables`' [..., 1])
    and the window mask. `rotary` False (a NoPE layer): cos 1 and sin 0, so RoPE leaves q and
    k exactly as they are; None or True: the tables as picked."""
    sliding, rotary = flags
    cos, sin = rope
    full, window = masks
    mask = full
    if window is not None and isinstance(sliding, bool):  # unrolled: the masks may differ
        k = int(sliding)                                    # in width (`Layout.ring`)
        cos, sin, mask = cos[..., k], sin[..., k], (window if sliding else full)
    elif window is not None:
        cos, sin, mask = (jnp.where(sliding, cos[..., 1], cos[..., 0]),
                          jnp.where(sliding, sin[..., 1], sin[..., 0]),
                          jnp.where(sliding, window, full))
    if rotary is None or rotary is True:
        return cos, sin, mask
    return jnp.where(rotary, cos, 1.0), jnp.where(rotary, sin, 0.0), mask


def in_compute_dtype(tree, dtype):
    """`tree` with every floating array in `dtype` (others, e.g. a backend's packed weights,
    as they are): the stored (master) parameters as the forward multiplies them."""

    def cast(x):
        if isinstance(x, jax.Array | np.ndarray) and jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, tree)


@partial(jax.jit, static_argnums=1)
def _cast_copy(params, dtype):
    return in_compute_dtype(params, dtype)


def compute_copy(params: nnx.State, arch: ModelArch) -> nnx.State:
    """A copy of (master) `params` in `arch`'s compute dtype, laid out as they are: the
    rollout weights (made once per update; the rollout then multiplies them uncast)."""
    return _cast_copy(params, jnp.dtype(arch.jnp_dtype))


def _scan_layers(graphdef, stacked, x_BxLxD, rope, masks, flags_N, kv_all, end,
                 ops, remat=False, activations=None, live_B=None):
    """Run the stacked blocks with lax.scan, carrying the whole cache so writes stay in place.

    `rope`, `masks` and `flags_N` (each layer's (sliding, rotary) flags, each None when no
    layer differs) as in `layer_inputs`: each step picks its layer's tables and mask.

    Each layer's weights are cast to the activations' (compute) dtype inside its step, so at
    most one layer's compute copy exists. `remat` (no cache only): each block is a
    `jax.checkpoint`, so the backward pass keeps only the blocks' inputs and recomputes one
    block (its casts included) at a time. `activations`: the sharding every block's input
    is held to (`_constrain`). `live_B`: the cache's `KVCache.live_B`.
    """
    dtype = x_BxLxD.dtype

    def block_out(x, layer_state, flags):
        block = nnx.merge(graphdef, in_compute_dtype(layer_state, dtype))
        return block(x, *layer_inputs(flags, rope, masks), None, ops)[0]

    if remat:
        block_out = jax.checkpoint(block_out, prevent_cse=False)

    def body(carry, xs):
        x, kv_all = carry
        x = _constrain(x, activations)
        layer_state, layer, flags = xs
        if kv_all is None:
            return (block_out(x, layer_state, flags), None), None
        block = nnx.merge(graphdef, in_compute_dtype(layer_state, dtype))
        x, kv_all = block(x, *layer_inputs(flags, rope, masks), (*kv_all, layer, end, live_B),
                          ops)
        return (x, kv_all), None

    layer_ids = jnp.arange(jax.tree.leaves(stacked)[0].shape[0], dtype=jnp.int32)
    (x_BxLxD, kv_all), _ = jax.lax.scan(body, (x_BxLxD, kv_all),
                                        (stacked, layer_ids, flags_N))
    return x_BxLxD, kv_all


def _constrain(x_BxLxD, activations):
    """`x_BxLxD` held to the `activations` sharding (None: the compiler's choice). The
    trainer passes its batch sharding: with FSDP's hidden-sharded embedding and no such
    constraint the TPU compiler laid the blocks out hidden-sharded with every row of the
    batch on every device (a whole-batch B x L x F MLP product per device, all-reduced;
    docs/aot.md)."""
    if activations is None:
        return x_BxLxD
    return jax.lax.with_sharding_constraint(x_BxLxD, activations)


def _unrolled_layers(graphdef, layer_states, x_BxLxD, rope, masks, flags, cache: LayerKVCache | None,
                     end, ops):
    """Run per-layer blocks one after another, each writing its own cache arrays in place
    (weights already in the compute dtype, as the rollout copy is, are not copied); layer i
    reads `layer_inputs(flags[i], rope, masks)`."""
    ks, vs = [], []
    for i, state in enumerate(layer_states):
        kv = None if cache is None else (cache.k_BxKxhdxS[i], cache.v_BxKxSxhd[i], None, end,
                                      None)
        block = nnx.merge(graphdef, in_compute_dtype(state, x_BxLxD.dtype))
        x_BxLxD, kv = block(x_BxLxD, *layer_inputs(flags[i], rope, masks), kv, ops)
        if kv is not None:
            ks.append(kv[0])
            vs.append(kv[1])
    return x_BxLxD, (tuple(ks), tuple(vs))


def _check_inputs(tokens_BxL, positions_BxL, cache, kv_valid_BxS, mask_BxLxS) -> None:
    """Ranks, shapes and dtypes of the forward's inputs (chex; at trace time under jit)."""
    chex.assert_rank(tokens_BxL, 2)
    chex.assert_type(tokens_BxL, int)
    b, length = tokens_BxL.shape
    slots = length if cache is None else cache.max_len
    if positions_BxL is not None:
        chex.assert_equal_shape([tokens_BxL, positions_BxL])
        chex.assert_type(positions_BxL, int)
    if kv_valid_BxS is not None:
        chex.assert_shape(kv_valid_BxS, (b, slots))
    if mask_BxLxS is not None:
        chex.assert_shape(mask_BxLxS, (b, length, slots))


@partial(jax.jit, static_argnums=0, static_argnames=("ops", "remat", "activations"))
def forward(graphdef, params, tokens_BxL, positions_BxL, cache=None, kv_valid_BxS=None,
            layers=None, rope=None, mask_BxLxS=None, window_mask_BxLxS=None, *,
            ops: ModelOps = XLA_OPS, remat=False, activations=None):
    """Pure form of `Qwen3.__call__` on (graphdef, params); jitted, so eager calls compile once."""
    return nnx.merge(graphdef, params)._apply(
        tokens_BxL, positions_BxL, cache, kv_valid_BxS, layers, rope, ops, remat, mask_BxLxS,
        activations, window_mask_BxLxS)


class Qwen3(nnx.Module):
    """Qwen3 decoder-only transformer with an optional KV cache (see package docstring)."""

    def __init__(self, arch: ModelArch, *, rngs: nnx.Rngs):
        self.arch = arch
        self.embed = Embed(arch, rngs=rngs)
        self.layers = _stacked_blocks(arch, rngs)
        self.final_norm = arch_norm(arch, arch.hidden, A.NORM)
        self.lm_head = None if arch.tie_embeddings else LMHead(arch, rngs=rngs)

    def __call__(
        self,
        tokens_BxL: jax.Array,
        positions_BxL: jax.Array | None,
        *,
        cache: KVCache | LayerKVCache | None = None,
        kv_valid_BxS: jax.Array | None = None,
        layers: tuple[nnx.State, ...] | None = None,
        rope: tuple[jax.Array, jax.Array] | None = None,
        mask_BxLxS: jax.Array | None = None,
        window_mask_BxLxS: jax.Array | None = None,
        ops: ModelOps = XLA_OPS,
        remat: bool = False,
        activations: Sharding | None = None,
    ) -> tuple[jax.Array, KVCache | LayerKVCache | None]:
        """Final-normed hidden states BxLxD and the cache with the L new tokens written.

        `layers` (from `unstack_layers()`, made once outside a decode loop) runs the layers
        as an unrolled loop over per-layer weights, with a `LayerKVCache` or no cache;
        without it the stacked layers are scanned, with a `KVCache` or no cache. `rope`,
        the (cos_BxLxR, sin_BxLxR) tables of the positions (`rope_cos_sin`), replaces
        computing them from `positions_BxL` (then None), e.g. tables made for every step
        before a decode loop (`rope_tables`: with sliding layers, a trailing axis of 2).
        `mask_BxLxS` (True: query i reads slot j) replaces the causal rule and
        `kv_valid_BxS`, for a cache whose slot order is not the token order (the rollout
        engine's ring of slots; RoPE makes attention order-free); with sliding layers it
        comes with `window_mask_BxLxS`, what a sliding layer's query reads (else the window
        is cut from slot distances, `window_mask`). `ops`
        (`locojax.model.ops.ModelOps`): the weight matmul and attention every layer uses
        (default XLA's); a caller that prepared `layers`' weights for its own `ops.matmul`
        passes those ops. `remat` (scanned layers, no cache: the training forward)
        checkpoints each decoder block: its backward keeps only block inputs. `activations`
        (scanned layers): the sharding of the B x L x D activations (the embedding's output
        and every block's input), e.g. the trainer's batch sharding.
        """
        return forward(*nnx.split(self), tokens_BxL, positions_BxL, cache, kv_valid_BxS, layers,
                       rope, mask_BxLxS, window_mask_BxLxS, ops=ops, remat=remat,
                       activations=activations)

    def unstack_layers(self) -> tuple[nnx.State, ...]:
        """Each layer's parameters as its own state (copied out of the stacks once)."""
        _, stacked = nnx.split(self.layers)
        return tuple(jax.tree.map(lambda x, i=i: x[i], stacked)
                     for i in range(self.arch.num_layers))

    def _masks(self, b, length, slots, end, kv_valid_BxS, mask_BxLxS, window_mask_BxLxS,
               causal=False):
        """(full, window) masks of `layer_inputs`: window None without sliding layers. `causal`
        (no cache, ops with `causal_attention`): full is the rule itself (`ValidTokens`)."""
        window = self.arch.sliding_window if self.arch.has_sliding else 0
        if causal and mask_BxLxS is None and not window:
            valid = jnp.ones((b, length), bool) if kv_valid_BxS is None else kv_valid_BxS
            return ValidTokens(valid.astype(bool)), None
        if mask_BxLxS is None:
            mask_BxLxS = attention_mask(b, length, slots, end, kv_valid_BxS)
            if window:
                window_mask_BxLxS = window_mask(mask_BxLxS, end, window)
        elif window and window_mask_BxLxS is None:
            raise TypeError("a model with sliding layers takes window_mask_BxLxS with mask_BxLxS")
        return mask_BxLxS, (window_mask_BxLxS if window else None)

    def _apply(self, tokens_BxL, positions_BxL, cache, kv_valid_BxS, layers, rope=None,
               ops: ModelOps = XLA_OPS, remat=False, mask_BxLxS=None, activations=None,
               window_mask_BxLxS=None):
        """The traced body of `__call__` (use `model(...)` or `forward`)."""
        arch = self.arch
        if cache is not None and isinstance(cache, LayerKVCache) != (layers is not None):
            raise TypeError("a LayerKVCache goes with unstacked `layers`, a KVCache without")
        _check_inputs(tokens_BxL, positions_BxL, cache, kv_valid_BxS, mask_BxLxS)
        b, length = tokens_BxL.shape
        x_BxLxD = _constrain(self.embed(tokens_BxL), activations)
        if rope is None:
            if positions_BxL is None:
                raise TypeError("give positions_BxL, or their RoPE tables as `rope`")
            rope = rope_tables(positions_BxL, arch)
        end = jnp.zeros((), jnp.int32) if cache is None else cache.end.astype(jnp.int32)
        slots = length if cache is None else cache.max_len
        masks = self._masks(b, length, slots, end, kv_valid_BxS, mask_BxLxS, window_mask_BxLxS,
                            cache is None and ops.causal_attention is not None)
        block_graphdef, stacked = nnx.split(self.layers)
        if layers is not None:
            x_BxLxD, kv_all = _unrolled_layers(
                block_graphdef, layers, x_BxLxD, rope, masks,
                tuple(zip(arch.sliding_layers, arch.rope_layers, strict=True)), cache, end, ops)
        else:
            kv_all = None if cache is None else (cache.k_NxBxKxSxhd, cache.v_NxBxKxSxhd)
            flags_N = (jnp.asarray(arch.sliding_layers) if arch.has_sliding else None,
                       jnp.asarray(arch.rope_layers) if arch.has_nope else None)
            x_BxLxD, kv_all = _scan_layers(
                block_graphdef, stacked, x_BxLxD, rope, masks, flags_N, kv_all, end,
                ops, remat if cache is None else False, activations,
                getattr(cache, "live_B", None))
        if cache is not None:
            cache = type(cache)(*kv_all, end=end + length)
        return self.final_norm(x_BxLxD), cache

    def unembed(self) -> jax.Array:
        """The output projection W_DxV as stored (the transposed embedding when tied); cast it
        to the hidden states' dtype before a matmul (`logits` and the trainer's log-probs do)."""
        if self.lm_head is None:
            return self.embed.embedding[...].T
        return self.lm_head.kernel[...]

    def logits(self, hidden_BxLxD: jax.Array) -> jax.Array:
        """fp32 logits BxLxV of final-normed hidden states."""
        w_DxV = self.unembed().astype(hidden_BxLxD.dtype)
        return jnp.einsum("bld,dv->blv", hidden_BxLxD, w_DxV, preferred_element_type=jnp.float32)


def split_params(model: Qwen3) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params): the static structure and the `nnx.Param` state of `model`."""
    return nnx.split(model, nnx.Param)


def abstract_model(arch: ModelArch) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params of jax.ShapeDtypeStruct) without allocating any parameter."""
    return split_params(nnx.eval_shape(lambda: Qwen3(arch, rngs=nnx.Rngs(0))))


def flat_params(params: nnx.State) -> dict[str, nnx.Param]:
    """'/'-joined path -> `nnx.Param` (value and logical-axis metadata)."""
    return {"/".join(map(str, path)): var for path, var in nnx.to_flat_state(params)}


def params_from_flat(arch: ModelArch, arrays: dict[str, np.ndarray | jax.Array]) -> nnx.State:
    """The params state of `arch` holding `arrays` (keyed by '/'-joined path; dtypes kept)."""
    _, abstract = abstract_model(arch)
    flat = flat_params(abstract)
    if set(arrays) != set(flat):
        raise ValueError(
            f"parameter names differ: missing {sorted(set(flat) - set(arrays))}, "
            f"unexpected {sorted(set(arrays) - set(flat))}"
        )
    for name, var in flat.items():
        if tuple(arrays[name].shape) != var.shape:
            raise ValueError(f"{name}: shape {arrays[name].shape}, expected {var.shape}")

    def fill(path, var):
        return var.replace(jnp.asarray(arrays["/".join(map(str, path))]))

    return nnx.map_state(fill, abstract)

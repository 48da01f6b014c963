"""Batched generation as one compiled program: prefill, then a device-side decode loop.

    params --unstack once--> per-layer weights + per-layer KV caches (read in place)
           (the backend's layout: on a CPU, weight matrices packed into panels)
    prompts (P, left-padded) --repeat G--> prefill (B = P*G rows) --> draw token 0
        --> lax.while_loop: feed token t-1 back (one decode step), logits of the new
            hidden state (one matmul), draw token t for every row, check stop ids;
            until T tokens or every row has stopped (no host round trip, no branch)
        --> Rollout (tokens, completion, log-probs, mask, lengths)

Rows of one prompt are adjacent (row p*G + g), so `x.reshape(P, G)` gives groups. Prompts are
left-padded to one length so they all end at the same cache slot; positions count from each
row's first real token. Shapes are static: fix the padded prompt length (`pad_prompts(...,
length=)`) to compile once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from locojax.model import LayerKVCache, Qwen3, init_cache, split_params
from locojax.model.layers import rope_cos_sin
from locojax.rollout.backend import XLA, Backend, KernelMode, choose
from locojax.rollout.sampler import SamplingSettings, sample_uniform, uniforms


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Rollout:
    """Sampled completions of B = prompts x G rows, rows of one prompt adjacent."""

    tokens_BxL: jax.Array
    """Left-padded prompt then completion: L = padded prompt length + T."""
    completion_BxT: jax.Array
    """Sampled ids; `pad_id` after a row's stop token."""
    logp_BxT: jax.Array
    """Log-prob of each id under the sampling distribution (behaviour policy); 0 off mask."""
    logp_model_BxT: jax.Array
    """Log-prob of each sampled id under the model's softmax at the sampling temperature, no
    top-k / top-p truncation (the trainer's pi_old at that temperature); 0 off mask."""
    mask_BxT: jax.Array
    """1.0 on real completion tokens (the stop token included), 0.0 after."""
    lengths_B: jax.Array
    """Completion tokens per row (int32), the stop token included."""
    prompt_len_B: jax.Array
    """Real prompt tokens per row (int32)."""

    @property
    def prompt_width(self) -> int:
        """Padded prompt length: completion token t sits at column prompt_width + t."""
        return self.tokens_BxL.shape[1] - self.completion_BxT.shape[1]

    def positions_BxL(self) -> jax.Array:
        """Rotary positions of `tokens_BxL`, counted from each row's first real token."""
        return positions(self.prompt_len_B, self.prompt_width, self.tokens_BxL.shape[1])

    def valid_BxL(self) -> jax.Array:
        """True on real prompt tokens and real completion tokens."""
        width, length = self.prompt_width, self.tokens_BxL.shape[1]
        col_L = jnp.arange(length, dtype=jnp.int32)
        first_B = width - self.prompt_len_B
        return (col_L >= first_B[:, None]) & (col_L < width + self.lengths_B[:, None])


def positions(prompt_len_B: jax.Array, width: int, length: int) -> jax.Array:
    """Column c of a row whose prompt is left-padded to `width` has position c - pad (>= 0)."""
    pad_B = width - prompt_len_B
    return jnp.maximum(jnp.arange(length, dtype=jnp.int32) - pad_B[:, None], 0)


def pad_prompts(
    prompts: Sequence[Sequence[int]], pad_id: int = 0, length: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad ragged prompts to `length` (default: the longest): (prompt_BxP, prompt_len_B)."""
    lens = np.array([len(p) for p in prompts], np.int32)
    width = int(lens.max()) if length is None else length
    if lens.min() < 1 or lens.max() > width:
        raise ValueError(f"prompt lengths must be in [1, {width}]; got {lens.min()}..{lens.max()}")
    out = np.full((len(prompts), width), pad_id, np.int32)
    for row, p in enumerate(prompts):
        out[row, width - len(p) :] = np.asarray(p, np.int32)
    return out, lens


def _constrain(x, sharding):
    return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class _Loop:
    """Carry of the decode loop: tokens [0, t) are drawn; token t - 1 is not yet fed back."""

    t: jax.Array
    cache: LayerKVCache
    ids_B: jax.Array
    done_B: jax.Array
    completion_BxT: jax.Array
    logp_BxT: jax.Array
    logp_model_BxT: jax.Array
    lengths_B: jax.Array


@partial(jax.jit, static_argnames=("graphdef", "new_tokens"))
def _rope_tables(params, prompt_PxW, prompt_len_P, *, graphdef, new_tokens):
    """RoPE (cos, sin) tables PxSxR of every cache slot's position, S = W + new_tokens.

    A program of its own: made inside the generation, XLA fuses the cos/sin into every
    layer's q and k fusions and recomputes them per element (~3 ms a call at the benchmark's
    size); as an input they are read, not recomputed.
    """
    arch = nnx.merge(graphdef, params).arch
    width = prompt_PxW.shape[1]
    return rope_cos_sin(positions(prompt_len_P, width, width + new_tokens), arch.head_dim,
                        arch.rope_theta)


@partial(jax.jit, static_argnames=("graphdef", "settings", "group_size", "batch_sharding",
                                   "backend"))
def _generate(params, prompt_BxP, prompt_len_B, key, rope_PxSxR, *, graphdef, settings,
              group_size, batch_sharding, backend: Backend = XLA):
    """The whole generation; `batch_sharding` (or None) lays rows out over devices.

    `backend` (`locojax.rollout.backend`) prepares the layer matrices and the output matrix
    once here (the CPU kernels: panels) and gives the model its matmul and attention.
    """
    model = nnx.merge(graphdef, params)
    T = settings.max_new_tokens
    prompt_BxP = _constrain(jnp.repeat(prompt_BxP, group_size, axis=0), batch_sharding)
    prompt_len_B = _constrain(jnp.repeat(prompt_len_B, group_size, axis=0), batch_sharding)
    cos_BxSxR, sin_BxSxR = (_constrain(jnp.repeat(x, group_size, axis=0), batch_sharding)
                            for x in rope_PxSxR)
    b, width = prompt_BxP.shape
    # Arrays with rows on axis 1 (per-step uniforms) shard like the batch.
    axis1_sharding = None if batch_sharding is None else NamedSharding(
        batch_sharding.mesh, P(None, *batch_sharding.spec))
    # Per-layer weights and caches, made once: each step reads them in place instead of
    # slicing its layer out of the stacked arrays (a copy per layer per step).
    layers = tuple(backend.prepare_layer(layer) for layer in model.unstack_layers())
    cache = LayerKVCache.from_stacked(init_cache(model.arch, b, width + T))
    cache = LayerKVCache(*(tuple(_constrain(x, batch_sharding) for x in xs)
                           for xs in (cache.k_BxKxhdxS, cache.v_BxKxSxhd)), cache.end)
    # Padding slots stay invalid for the whole generation; decode slots are all real.
    valid_BxS = jnp.arange(width + T, dtype=jnp.int32) >= (width - prompt_len_B)[:, None]
    # Hoisted out of the loop: one DxV matrix, read once per step by one matmul.
    unembed_DxV = backend.output_matrix(model)
    stop_S = jnp.asarray(settings.stop_ids or (-1,), jnp.int32)
    # Every step's uniforms at once: no random-bit generation inside the loop.
    u_TxBx2 = _constrain(uniforms(key, (T, b)), axis1_sharding)

    def draw(s: _Loop, hidden_BxD: jax.Array) -> _Loop:
        """Sample token s.t of every live row from its last hidden state."""
        d = sample_uniform(backend.logits(hidden_BxD, unembed_DxV), u_TxBx2[s.t], settings)
        ids_B = jnp.where(s.done_B, settings.pad_id, d.ids_B)
        return _Loop(
            t=s.t + 1, cache=s.cache, ids_B=ids_B,
            done_B=s.done_B | jnp.any(ids_B[:, None] == stop_S, axis=-1),
            completion_BxT=s.completion_BxT.at[:, s.t].set(ids_B),
            logp_BxT=s.logp_BxT.at[:, s.t].set(jnp.where(s.done_B, 0.0, d.logp_B)),
            logp_model_BxT=s.logp_model_BxT.at[:, s.t].set(
                jnp.where(s.done_B, 0.0, d.logp_model_B)),
            lengths_B=s.lengths_B + (~s.done_B).astype(jnp.int32),
        )

    def feed_and_draw(s: _Loop) -> _Loop:
        """Feed token t - 1 back through the model (one decode step), then draw token t.

        Branch-free: the loop condition alone decides whether another step runs, so the
        last token (or one that ends every row) is never fed and the cache is never copied.
        """
        # Token t - 1 sits at slot width + t - 1: its RoPE tables are that column's.
        hidden_Bx1xD, cache = model(s.ids_B[:, None], None, cache=s.cache,
                                    kv_valid_BxS=valid_BxS, layers=layers,
                                    rope=tuple(jax.lax.dynamic_slice_in_dim(x, width + s.t - 1, 1, 1)
                                               for x in (cos_BxSxR, sin_BxSxR)),
                                    ops=backend.ops)
        return draw(dataclasses.replace(s, cache=cache), hidden_Bx1xD[:, 0])

    hidden_BxPxD, cache = model(prompt_BxP, None, cache=cache,
                                kv_valid_BxS=valid_BxS, layers=layers,
                                rope=(cos_BxSxR[:, :width], sin_BxSxR[:, :width]),
                                ops=backend.ops)
    zeros_BxT = _constrain(jnp.zeros((b, T), jnp.float32), batch_sharding)
    start = _Loop(
        t=jnp.zeros((), jnp.int32), cache=cache, ids_B=jnp.zeros((b,), jnp.int32),
        done_B=jnp.zeros((b,), bool), completion_BxT=jnp.full((b, T), settings.pad_id, jnp.int32),
        logp_BxT=zeros_BxT, logp_model_BxT=zeros_BxT, lengths_B=jnp.zeros((b,), jnp.int32),
    )
    out = jax.lax.while_loop(lambda s: (s.t < T) & ~jnp.all(s.done_B), feed_and_draw,
                             draw(start, hidden_BxPxD[:, -1]))
    mask_BxT = (jnp.arange(T, dtype=jnp.int32) < out.lengths_B[:, None]).astype(jnp.float32)
    return Rollout(
        tokens_BxL=jnp.concatenate([prompt_BxP, out.completion_BxT], axis=1),
        completion_BxT=out.completion_BxT,
        logp_BxT=out.logp_BxT,
        logp_model_BxT=out.logp_model_BxT,
        mask_BxT=mask_BxT,
        lengths_B=out.lengths_B,
        prompt_len_B=prompt_len_B,
    )


def generate(
    model: Qwen3 | tuple[nnx.GraphDef, nnx.State],
    prompts: Sequence[Sequence[int]] | tuple[np.ndarray, np.ndarray],
    settings: SamplingSettings,
    key: jax.Array,
    *,
    group_size: int = 1,
    mesh: Mesh | None = None,
    batch_axis: str | tuple[str, ...] = "replica",
    cpu_kernels: KernelMode | str = KernelMode.auto,
) -> Rollout:
    """Sample `group_size` completions of every prompt in one compiled program.

    `model` is a Qwen3 module or its (graphdef, params). `prompts` is a ragged list of id
    lists or (left-padded prompt_BxP, prompt_len_B). With a `mesh`, rows are sharded over
    `batch_axis` and parameters are replicated unless they already live on that mesh.
    `cpu_kernels` (`KernelMode`): auto runs the CPU kernels (`locojax.kernels`: panel matmul,
    decode attention) where they apply (a CPU, every row on one device, fp32 weights) and
    logs its choice once; off keeps XLA's ops; on raises ValueError where they do not apply.
    """
    graphdef, params = split_params(model) if isinstance(model, Qwen3) else model
    if isinstance(prompts, tuple) and len(prompts) == 2 and np.ndim(prompts[0]) == 2:
        prompt_BxP, prompt_len_B = prompts
    else:
        prompt_BxP, prompt_len_B = pad_prompts(prompts, settings.pad_id)
    prompt_BxP = jnp.asarray(prompt_BxP, jnp.int32)
    prompt_len_B = jnp.asarray(prompt_len_B, jnp.int32)
    batch_sharding = None
    if mesh is not None:
        batch_sharding = NamedSharding(mesh, P(batch_axis))
        shards = int(np.prod([mesh.shape[a] for a in np.atleast_1d(batch_axis)]))
        if prompt_BxP.shape[0] * group_size % shards:
            raise ValueError(
                f"prompts x group_size = {prompt_BxP.shape[0]} x {group_size} rows do not "
                f"split over {shards} devices of mesh axis {batch_axis!r}"
            )
        params = _on_mesh(params, mesh)
    rope = _rope_tables(params, prompt_BxP, prompt_len_B, graphdef=graphdef,
                        new_tokens=settings.max_new_tokens)
    return _generate(params, prompt_BxP, prompt_len_B, key, rope, graphdef=graphdef,
                     settings=settings, group_size=group_size, batch_sharding=batch_sharding,
                     backend=choose(cpu_kernels, params, mesh))


def _on_mesh(params: nnx.State, mesh: Mesh) -> nnx.State:
    """Parameters already placed on `mesh` keep their sharding; the rest are replicated."""
    replicated = NamedSharding(mesh, P())

    def place(x):
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
            return x
        return jax.device_put(x, replicated)

    return jax.tree.map(place, params)

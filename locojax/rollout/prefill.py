"""Program 1 of a generation: each prompt's KV once, token 0 of every row, the tables.

    prompts (N x W, left-padded) --one forward with a W-slot cache--> store (per layer: keys
        NxKxhdxW, values NxKxWxhd) + last hidden state --> logits NxV --> token 0 of each of
        a prompt's G rows (G prompt-sized draws)
    uniforms u[b, t] keyed by (key, row id, token t); RoPE tables of positions 0..W+T-1
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from locojax.model.layers import rope_tables
from locojax.rollout.backend import XLA
from locojax.rollout.layout import (
    Layout,
    cache_arrays,
    model_cache,
    replica_row0,
    store_index,
    zero_cache,
)
from locojax.rollout.sampler import Draw, sample_uniform


def positions(prompt_len_B: jax.Array, width: int, length: int) -> jax.Array:
    """Column c of a row whose prompt is left-padded to `width` has position c - pad (>= 0)."""
    pad_B = width - prompt_len_B
    return jnp.maximum(jnp.arange(length, dtype=jnp.int32) - pad_B[:, None], 0)


def row_uniforms(key: jax.Array, rows_B: jax.Array, tokens: int) -> jax.Array:
    """Uniforms BxTx2 of each row's draws: u[b, t] from the key of (key, row id, token t)."""

    def one_row(row):
        k = jax.random.fold_in(key, row)
        return jax.vmap(lambda t: jax.random.uniform(jax.random.fold_in(k, t), (2,)))(
            jnp.arange(tokens, dtype=jnp.int32))

    return jax.vmap(one_row)(rows_B)


def prefill_local(params, prompt_NxW, len_N, key, *, graphdef, settings, layout: Layout):
    """Prefill this replica's first `store_rows` prompts into the store; draw token 0 of their
    rows; make the uniforms and RoPE tables of all its rows."""
    model = nnx.merge(graphdef, params)
    arch, T, width = model.arch, settings.max_new_tokens, layout.width
    row0, store0 = replica_row0(layout)
    # SxR, or SxRx2 with sliding layers (`rope_tables`): rows index the leading axis alike.
    cos_SxR, sin_SxR = (x[0] for x in rope_tables(
        jnp.arange(width + T, dtype=jnp.int32)[None], arch))
    if layout.chunked:
        prompt_NxW, len_N = prompt_NxW[:layout.store_rows], len_N[:layout.store_rows]
    ks, vs, logits_NxV = prefill_kv(model, prompt_NxW, len_N, (cos_SxR, sin_SxR), layout)
    rows_B = row0 + jnp.arange(layout.rows, dtype=jnp.int32)
    u_BxTx2 = row_uniforms(key, rows_B, T)
    rows = layout.store_rows * layout.group_size if layout.chunked else layout.rows
    src_B = store_index(rows_B[:rows], store0, layout)
    if layout.shared:
        # Rows of store entry i are i*G + g (a whole group per entry): G draws per prompt.
        first = group_draws(logits_NxV, u_BxTx2[:rows, 0], src_B, layout.group_size, settings)
    else:
        first = sample_uniform(logits_NxV[src_B], u_BxTx2[:, 0], settings)
    return ks, vs, first, u_BxTx2, (cos_SxR, sin_SxR)


def prefill_kv(model, prompt_NxW, len_N, rope_SxR, layout: Layout):
    """One forward of N left-padded prompts: their KV (`zero_cache` layout, W columns) and the
    logits after each prompt's last token."""
    width = layout.width
    cos_SxR, sin_SxR = rope_SxR
    pos_NxW = positions(len_N, width, width)
    valid_NxW = jnp.arange(width, dtype=jnp.int32) >= (width - len_N)[:, None]
    n = prompt_NxW.shape[0]
    cache = model_cache(layout, *zero_cache(layout, model.arch, n, width),
                        jnp.zeros((), jnp.int32))
    # Prefill rows are many: XLA's dot suits them better than the decode kernels.
    hidden_NxWxD, cache = model(prompt_NxW, None, cache=cache, kv_valid_BxS=valid_NxW,
                                layers=model.unstack_layers() if layout.layer_caches else None,
                                rope=(cos_SxR[pos_NxW], sin_SxR[pos_NxW]))
    logits_NxV = XLA.logits(hidden_NxWxD[:, -1], XLA.output_matrix(model, copy=False))
    return (*cache_arrays(cache), logits_NxV)


def group_draws(logits_NxV, u_Bx2, src_B, g, settings) -> Draw:
    """Token 0 of every row from its prompt's logits, one prompt-sized draw per group member."""
    b = u_Bx2.shape[0]
    if b % g == 0 and src_B.shape[0] == b:
        # Row i*G + j reads entry src[i*G]; draw member j of every group at once.
        p_rows = src_B.reshape(-1, g)[:, 0]
        logits_PxV = logits_NxV[p_rows]
        draws = jax.lax.map(lambda u_Px2: sample_uniform(logits_PxV, u_Px2, settings),
                            u_Bx2.reshape(-1, g, 2).transpose(1, 0, 2))
        return jax.tree.map(lambda x: x.T.reshape(b), draws)
    return sample_uniform(logits_NxV[src_B], u_Bx2, settings)

"""Decode attention over a ring of cache columns that reads only each slot's live columns.

    q_BxKxGxhd, k/v NxBxKxCxhd (every layer's cache, one array), layer, end, live_B
      --per slot group, per column block back from `end`--> online softmax
      --> ctx_BxKxGxhd

A slot's live columns are the `live_B[b]` columns ending at column `end mod C` (inclusive),
wrapping past column 0: the rollout engine writes every slot's new token at one column per
step, so each slot's prompt and tokens sit just before it on the ring. The kernel walks the
C / `block` column blocks from the one holding `end` backwards; a group of `slots` slots reads
a block only while some slot of the group still has live columns in it (a block index that
repeats is not fetched again), so the bytes read follow the longest live span of each group,
not the cache width. The layer's cache is read in place from the stacked array (no slice
copy). Scores in fp32, scaled by hd^-0.5 (`locojax.model.ops` conventions: query head
h = k * G + g reads kv head k); a slot with no live column gets zeros.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

MASKED = -1e30
"""Score of a column a slot does not read (finite: an all-masked block adds nothing)."""
LANES = 128
"""Lane width: the running max and sum are kept replicated over it."""
VMEM_LIMIT = 64 * 2**20
"""Scoped VMEM the kernel may use (a group's key and value blocks, double-buffered)."""


def blocks_needed(end, live_B, cols: int, block: int) -> jax.Array:
    """Column blocks each slot's live span touches, counted back from the block of `end`."""
    cur = end % cols
    first = cur - live_B + 1
    need = cur // block - jnp.floor_divide(first, block) + 1
    return jnp.where(live_B > 0, jnp.clip(need, 1, cols // block), 0).astype(jnp.int32)


def block_for(cols: int) -> int:
    """Columns per block for a cache of `cols` columns."""
    del cols
    return LANES


def _group_slots(slots: int, per_slot_bytes: int, budget: int) -> int:
    """The largest divisor of `slots` whose blocks fit `budget` bytes (at least 1)."""
    fits = [d for d in range(1, slots + 1) if slots % d == 0 and d * per_slot_bytes <= budget]
    return max(fits, default=1)


def _block_at(cur, back, block: int, nb: int):
    """The column block `back` blocks before the one holding column `cur` (non-negative
    operands: C-style division, which Mosaic lowers without the device's sign rule)."""
    return jax.lax.rem(jax.lax.div(cur, block) - back + nb, nb)


def _kernel(layer_ref, cur_ref, total_ref, group_ref, block_ref, flag_ref, live_ref, q_ref,
            k_ref, v_ref, o_ref, m_sc, l_sc, acc_sc, *, cols: int, block: int, slots: int):
    t = pl.program_id(0)
    g, flag = group_ref[t], flag_ref[t]
    n, heads, group, hd = q_ref.shape

    @pl.when(flag % 2 == 1)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, MASKED, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    @pl.when(t < total_ref[0])
    def _absorb():
        rows = n * heads
        q = q_ref[...].reshape(rows, group, hd)
        k = k_ref[...].reshape(rows, block, hd)
        v = v_ref[...].reshape(rows, block, hd)
        s = jnp.einsum("rgd,rcd->rgc", q, k, preferred_element_type=jnp.float32)
        s = s * (hd ** -0.5)
        col = block_ref[t] * block + jax.lax.broadcasted_iota(jnp.int32, (n, block), 1)
        back = cur_ref[0] - col
        back = jnp.where(back < 0, back + cols, back)
        slot = jax.lax.broadcasted_iota(jnp.int32, (n, block), 0)
        live = jnp.zeros((n, block), jnp.int32)
        for j in range(slots):
            live = jnp.where(slot == j, live_ref[g * slots + j], live)
        keep = jnp.broadcast_to((back < live)[:, None, None, :], (n, heads, group, block))
        keep = keep.reshape(rows, group, block)
        s = jnp.where(keep, s, MASKED)
        m_prev, l_prev = m_sc[...], l_sc[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.where(keep, jnp.exp(s - m_new[..., :1]), 0.0)
        l_sc[...] = alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)
        m_sc[...] = m_new
        pv = jnp.einsum("rgc,rcd->rgd", p.astype(v.dtype), v,
                        preferred_element_type=jnp.float32)
        acc_sc[...] = acc_sc[...] * alpha[..., :1] + pv

    @pl.when(flag >= 2)
    def _finish():
        total = l_sc[...][..., :1]
        out = jnp.where(total > 0, acc_sc[...] / jnp.where(total > 0, total, 1.0), 0.0)
        o_ref[...] = out.reshape(o_ref.shape).astype(o_ref.dtype)


def work_items(need_g, cur, cols: int, block: int):
    """The kernel's grid, one item a (group, column block) that some slot of the group reads:
    (items, group_T, block_T, flag_T) over T = groups x blocks entries, the first `items`
    in use (a group's blocks back from the one holding `cur`; flag bit 0: a group's first
    item, bit 1: its last). Every group has an item (a group of free slots reads one block,
    masked), so every output block is written. Entries past `items` repeat the last one."""
    nb = cols // block
    need_g = jnp.maximum(need_g, 1)
    ends_g = jnp.cumsum(need_g)
    items = ends_g[-1]
    t_T = jnp.minimum(jnp.arange(need_g.shape[0] * nb, dtype=jnp.int32), items - 1)
    group_T = jnp.sum(t_T[:, None] >= ends_g[None, :], axis=1).astype(jnp.int32)
    i_T = t_T - (ends_g - need_g)[group_T]
    block_T = _block_at(jnp.asarray(cur, jnp.int32), i_T, block, nb)
    flag_T = (i_T == 0).astype(jnp.int32) + 2 * (i_T == need_g[group_T] - 1).astype(jnp.int32)
    in_use = jnp.arange(t_T.shape[0]) < items
    return items, group_T, block_T, jnp.where(in_use, flag_T, 0)


@functools.partial(jax.jit, static_argnames=("block", "budget", "interpret"))
def ragged_decode_attention(q_BxKxGxhd, k_NxBxKxCxhd, v_NxBxKxCxhd, layer, end, live_B, *,
                            block: int = 128, budget: int = 2**19,
                            interpret: bool = False) -> jax.Array:
    """softmax(q K^T / sqrt(hd)) V over each slot's live ring columns (module docstring).

    `layer` (int32 scalar) picks the layer of the stacked caches, `end` (int32) the column of
    every slot's newest token (taken mod C), `live_B` (int32) how many columns each slot reads
    back from it (0: none). C must be a multiple of `block`, itself of 16. `budget`: bytes of
    one key block per grid step, which sets how many slots a step reads together. On a TPU
    the grid has exactly the items in use (a dynamic bound); the interpreter walks them all.
    """
    _, b, heads, cols, hd = k_NxBxKxCxhd.shape
    group = q_BxKxGxhd.shape[2]
    if cols % block or block % 16:
        raise ValueError(f"cache columns {cols} are not a multiple of block {block} (of 16)")
    slots = _group_slots(b, heads * block * hd * k_NxBxKxCxhd.dtype.itemsize, budget)
    cur = jnp.asarray(end % cols, jnp.int32)
    need_g = blocks_needed(cur, live_B, cols, block).reshape(b // slots, slots).max(axis=1)
    items, group_T, block_T, flag_T = work_items(need_g, cur, cols, block)
    scalars = (jnp.asarray(layer, jnp.int32).reshape(1), cur.reshape(1), items.reshape(1),
               group_T, block_T, flag_T, live_B.astype(jnp.int32))
    kv_spec = pl.BlockSpec((None, slots, heads, block, hd),
                           lambda t, layer, cur, total, grp, blk, *_: (layer[0], grp[t], 0,
                                                                       blk[t], 0))
    q_spec = pl.BlockSpec((slots, heads, group, hd), lambda t, layer, cur, total, grp, *_: (
        grp[t], 0, 0, 0))
    rows = slots * heads
    kernel = functools.partial(_kernel, cols=cols, block=block, slots=slots)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(scalars), grid=(group_T.shape[0] if interpret else items,),
            in_specs=[q_spec, kv_spec, kv_spec], out_specs=q_spec,
            scratch_shapes=[pltpu.VMEM((rows, group, LANES), jnp.float32),
                            pltpu.VMEM((rows, group, LANES), jnp.float32),
                            pltpu.VMEM((rows, group, hd), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct(q_BxKxGxhd.shape, q_BxKxGxhd.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",),
                                             vmem_limit_bytes=VMEM_LIMIT),
        interpret=interpret,
    )(*scalars, q_BxKxGxhd, k_NxBxKxCxhd, v_NxBxKxCxhd)

"""Program 2 of a generation: every row through a fixed set of slots, in one while loop.

    per iteration: refill (free slots take the next pending rows: the prompt's KV copied from
    the store into the slot, token 0 drawn by the prefill; `static`: only once every slot is
    free), then one decode step of every slot (feed its last token, draw token n with
    u[row, n], write it at (row, n)); a row that draws a stop id or reaches T frees its slot.
    Until no slot is live and no row is pending. A chunked store (`layout.chunked`): rows
    enter in row order, only those whose prompt is in the store; once all of them have
    entered and a slot is free (static: every slot), the iteration prefills the next
    `store_rows` prompts into the store (token 0 of their rows too) instead.

Each slot's C = W + T cache columns are a ring: decode step s writes column (W + s) mod C of
every slot (one in-place slice write for all rows, as in a lockstep loop), and a row that
enters at step s0 gets its prompt in the W columns before (W + s0) mod C. A row never outlives
its C columns, so nothing it reads is overwritten; attention reads the row's columns through
an explicit mask (with RoPE applied before caching, the order of columns does not matter).
A sliding layer whose window N is narrower than C (`layout.ring`) keeps a ring of N columns:
step s writes column (W + s) mod N, over the token N back, which no query of the row reads
again; a row enters with the last min(W, N) columns of its prompt before (W + s0) mod N.
The first wave's rows lie exactly as in a lockstep loop: prompt in [0, W), token t at W + t.
A free slot still runs through the step (shapes are static); it writes only its own ring, and
its outputs are dropped.

    decode_local: the row tables (`_pending_rows`), the first carry (`_start`), then the loop,
    each iteration a `_step`: `_refill` (prompts copied in: `_copy_prompts`) then `_decode`,
    or with a chunked store `_prefill_next`; what they read is one `_Replica`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
from flax import nnx

from locojax.rollout.backend import Backend
from locojax.rollout.layout import (
    Layout,
    cache_arrays,
    cache_axes,
    model_cache,
    replica_row0,
    store_index,
    zero_cache,
)
from locojax.rollout.prefill import group_draws, prefill_kv
from locojax.rollout.sampler import Draw, SamplingSettings, sample_uniform


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class _Loop:
    """Carry of the slot loop. Slot j holds row `row_S[j]` (-1: free) with `n_S[j]` tokens
    drawn, the last of them (`ids_S[j]`) not yet fed back; token i's KV sits in cache column
    (start_S[j] + i) mod C, its prompt's W columns just before start_S[j] (mod C)."""

    ks: tuple[jax.Array, ...]
    """Keys of the slots' caches (`layout.zero_cache`)."""
    vs: tuple[jax.Array, ...]
    row_S: jax.Array
    n_S: jax.Array
    start_S: jax.Array
    ids_S: jax.Array
    next: jax.Array
    """Pending rows taken so far (index into the pending order)."""
    completion_BxT: jax.Array
    logp_BxT: jax.Array
    logp_model_BxT: jax.Array
    lengths_B: jax.Array
    steps: jax.Array
    """Decode steps so far; step s writes cache column (W + s) mod C of every slot."""
    live_steps: jax.Array
    store_k: tuple[jax.Array, ...] = ()
    """A chunked store (`layout.chunked`): the KV of prompts [chunk * N, (chunk + 1) * N) of
    the replica, N = `layout.store_rows` (else empty: the store is an argument)."""
    store_v: tuple[jax.Array, ...] = ()
    chunk: jax.Array | None = None


def _ring_row(block, width: int, cols: int, at, axis: int):
    """A prompt block of `width` columns (on `axis`) as a `cols`-column row, starting at `at`
    and wrapping past the end."""
    pad = [(0, 0)] * block.ndim
    pad[axis] = (0, cols - width)
    return jnp.roll(jnp.pad(block, pad), at, axis=axis)


def _stops(ids_B, stop_S):
    """Rows whose id is a stop id."""
    return jnp.any(ids_B[:, None] == stop_S, axis=-1)


def _ended_at_0(ids_B, stop_S, T: int):
    """Rows whose token 0 is `ids_B` are done before any decode step."""
    return _stops(ids_B, stop_S) | (T == 1)


@dataclass(frozen=True)
class _Replica:
    """What every iteration of one replica's slot loop reads: the model, its prepared
    weights, the static facts and the replica's row tables (built once per trace)."""

    model: nnx.Module
    layers: tuple | None
    """Per-layer weights in the backend's layout (None: stacked, read in place)."""
    unembed: object
    settings: SamplingSettings
    layout: Layout
    backend: Backend
    stop_S: jax.Array
    src_B: jax.Array
    """Store entry (on this replica) of each row's prompt."""
    len_B: jax.Array
    len_N: jax.Array
    first: Draw
    """Token 0 of every row (a chunked store: of the first chunk's rows, zeros after)."""
    order_B: jax.Array
    """Rows in the order they take slots."""
    pending: jax.Array
    """Rows that take a slot."""
    col_C: jax.Array
    store_k: tuple
    store_v: tuple
    u_BxTx2: jax.Array
    rope_SxR: tuple[jax.Array, jax.Array]
    prompt_NxW: jax.Array | None

    @property
    def T(self) -> int:
        """New tokens per row at most."""
        return self.settings.max_new_tokens

    @property
    def cols(self) -> int:
        """Cache columns of a slot: C = W + T."""
        return self.layout.width + self.T

    @property
    def chunk_rows(self) -> int:
        """Rows of the prompts a chunked store holds at once."""
        return self.layout.store_rows * self.layout.group_size


def decode_local(params, store_k, store_v, first: Draw, len_N, u_BxTx2, rope_SxR,
                 prompt_NxW=None, *, graphdef, settings, layout: Layout, backend: Backend):
    """Run this replica's rows through its slots (see the module docstring). A chunked store
    (`layout.chunked`) holds the first `store_rows` prompts' KV and `first` their rows' token
    0; `prompt_NxW` (the replica's prompts) feeds the prefills of the next ones."""
    model = nnx.merge(graphdef, params)
    row0, store0 = replica_row0(layout)
    src_B = store_index(row0 + jnp.arange(layout.rows, dtype=jnp.int32), store0, layout)
    len_B = len_N[src_B]
    # Stacked weights with per-layer caches (`layout.ring`) are sliced in every step.
    layers = None if layout.stacked else tuple(
        backend.prepare_layer(layer) for layer in model.unstack_layers())
    # Stacked (accelerators): no copy of the weights at all, the output matrix included.
    unembed = backend.output_matrix(model, copy=not layout.stacked)
    stop_S = jnp.asarray(settings.stop_ids or (-1,), jnp.int32)
    first, done0_B, order_B, pending = _pending_rows(first, stop_S, settings.max_new_tokens,
                                                     layout)
    r = _Replica(model=model, layers=layers, unembed=unembed, settings=settings,
                 layout=layout, backend=backend, stop_S=stop_S, src_B=src_B, len_B=len_B,
                 len_N=len_N, first=first, order_B=order_B, pending=pending,
                 col_C=jnp.arange(layout.width + settings.max_new_tokens, dtype=jnp.int32),
                 store_k=store_k, store_v=store_v, u_BxTx2=u_BxTx2, rope_SxR=rope_SxR,
                 prompt_NxW=prompt_NxW)
    out = jax.lax.while_loop(lambda s: jnp.any(s.row_S >= 0) | (s.next < pending),
                             lambda s: _step(s, r), _start(r, done0_B))
    return (out.completion_BxT, out.logp_BxT, out.logp_model_BxT, out.lengths_B, len_B,
            out.steps[None], out.live_steps[None])


def _pending_rows(first: Draw, stop_S, T: int, layout: Layout):
    """(first, done0_B, order_B, pending): token 0 of every row, the rows done at token 0,
    the order rows take slots in and how many take one."""
    b = layout.rows
    if layout.chunked:
        # Rows enter in row order, a chunk's rows once its prompts are in the store; a row
        # that ended at token 0 enters and leaves at once (its token 0 is drawn by a prefill).
        chunk_rows = layout.store_rows * layout.group_size
        first = jax.tree.map(lambda x: jnp.zeros((b,), x.dtype).at[:chunk_rows].set(x), first)
        done0_B = _ended_at_0(first.ids_B, stop_S, T) & (jnp.arange(b) < chunk_rows)
        order_B, pending = jnp.arange(b, dtype=jnp.int32), jnp.int32(b)
        return first, done0_B, order_B, pending
    done0_B = _ended_at_0(first.ids_B, stop_S, T)
    # Rows still to decode, in row order; a row that ended at token 0 never takes a slot.
    order_B = jnp.argsort(done0_B, stable=True).astype(jnp.int32)
    pending = jnp.sum(~done0_B).astype(jnp.int32)
    return first, done0_B, order_B, pending


def _start(r: _Replica, done0_B) -> _Loop:
    """The loop's carry before its first iteration: every slot free, token 0 recorded."""
    b, T, first, layout = r.layout.rows, r.T, r.first, r.layout
    zeros_BxT = jnp.zeros((b, T), jnp.float32)
    ks, vs = zero_cache(layout, r.model.arch, layout.slots, r.cols, ring=True)
    return _Loop(
        ks=ks, vs=vs,
        row_S=jnp.full((layout.slots,), -1, jnp.int32), n_S=jnp.ones((layout.slots,), jnp.int32),
        start_S=jnp.full((layout.slots,), layout.width, jnp.int32),
        ids_S=jnp.zeros((layout.slots,), jnp.int32),
        next=jnp.zeros((), jnp.int32),
        completion_BxT=jnp.full((b, T), r.settings.pad_id, jnp.int32).at[:, 0].set(first.ids_B),
        logp_BxT=zeros_BxT.at[:, 0].set(first.logp_B),
        logp_model_BxT=zeros_BxT.at[:, 0].set(first.logp_model_B),
        lengths_B=jnp.where(done0_B, 1, 0).astype(jnp.int32),
        steps=jnp.zeros((), jnp.int32), live_steps=jnp.zeros((), jnp.int32),
        **(dict(store_k=r.store_k, store_v=r.store_v, chunk=jnp.zeros((), jnp.int32))
           if layout.chunked else {}))


def _step(s: _Loop, r: _Replica) -> _Loop:
    """One iteration: refill and decode, or (a chunked store whose rows have all entered,
    with room in the slots) prefill the next chunk into the store."""
    if not r.layout.chunked:
        return _decode(_refill(s, r), r)
    free_S = s.row_S < 0
    room = jnp.any(free_S) if r.layout.refill else jnp.all(free_S)
    need = (s.next >= (s.chunk + 1) * r.chunk_rows) & (s.next < r.layout.rows) & room
    return jax.lax.cond(need, lambda s: _prefill_next(s, r), lambda s: _decode(_refill(s, r), r),
                        s)


def _refill(s: _Loop, r: _Replica) -> _Loop:
    """Free slots take the next pending rows (static: only once every slot is free)."""
    layout, chunked = r.layout, r.layout.chunked
    free_S = s.row_S < 0
    allowed = jnp.all(free_S) if not layout.refill else True
    idx_S = s.next + jnp.cumsum(free_S, dtype=jnp.int32) - 1
    # A chunked store: only rows whose prompts are in it.
    end = jnp.minimum((s.chunk + 1) * r.chunk_rows, r.pending) if chunked else r.pending
    take_S = free_S & allowed & (idx_S < end)
    row_S = jnp.where(take_S, r.order_B[jnp.minimum(idx_S, layout.rows - 1)], s.row_S)
    taken = jnp.sum(take_S, dtype=jnp.int32)
    slot_order = jnp.argsort(~take_S, stable=True).astype(jnp.int32)
    # This step writes column `now`: the new row's token 0 goes there, its prompt before.
    now = (layout.width + s.steps) % r.cols
    ks, vs = _copy_prompts(s, r, row_S, slot_order, taken, layout.width + s.steps)
    safe_S = jnp.maximum(row_S, 0)
    n_S, start_S = jnp.where(take_S, 1, s.n_S), jnp.where(take_S, now, s.start_S)
    ids_S = jnp.where(take_S, s.completion_BxT[safe_S, 0] if chunked
                      else r.first.ids_B[safe_S], s.ids_S)
    if chunked:
        # Rows that ended at token 0 leave their slot before the decode step.
        row_S = jnp.where(take_S & _ended_at_0(ids_S, r.stop_S, r.T), -1, row_S)
    return replace(s, ks=ks, vs=vs, row_S=row_S, n_S=n_S, start_S=start_S, ids_S=ids_S,
                   next=s.next + taken)


def _copy_prompts(s: _Loop, r: _Replica, row_S, slot_order, taken, step_col):
    """The slots' caches with the prompt KV of the `taken` new rows (slots
    `slot_order[:taken]`) copied in from the store, on each cache's ring just before column
    `step_col` (W + step) modulo its columns: the last min(W, columns) prompt columns."""
    layout = r.layout
    sk, sv = (s.store_k, s.store_v) if layout.chunked else (r.store_k, r.store_v)
    row_axis, k_col, v_col = cache_axes(layout)

    def put(c, x, j, e, col):
        """Store entry e of `x` into slot j of `c`, its last columns on the ring."""
        cols = c.shape[col]
        keep = min(layout.width, cols)
        entry = jax.lax.dynamic_slice_in_dim(x, e, 1, row_axis)
        block = jax.lax.slice_in_dim(entry, layout.width - keep, layout.width, axis=col)
        row = _ring_row(block, keep, cols, (step_col - keep) % cols, col)
        start = [jnp.zeros((), jnp.int32)] * c.ndim
        start[row_axis] = j
        return jax.lax.dynamic_update_slice(c, row, start)

    def copy(i, kv):
        ks, vs = kv
        j = slot_order[i]
        e = r.src_B[row_S[j]]
        if layout.chunked:
            e = e - s.chunk * layout.store_rows
        return (tuple(put(c, x, j, e, k_col) for c, x in zip(ks, sk, strict=True)),
                tuple(put(c, x, j, e, v_col) for c, x in zip(vs, sv, strict=True)))

    return jax.lax.fori_loop(0, taken, copy, (s.ks, s.vs))


def _window_mask(valid_SxC, off_SxC, n_S, plen_S, step_col, r: _Replica):
    """What a sliding layer's query (completion token n-1 of its slot) reads, Sx1xC: the valid
    columns fewer than `arch.sliding_window` tokens back on the ring (the prompt sits just
    before token 0, so the distance is (n - 1 - offset) mod cols); None without sliding
    layers. With a ring of their own (`layout.ring` = N columns), Sx1xN: column c holds the
    token (`step_col` - c) mod N back, written by this row if that is under n + its prompt
    length."""
    arch, ring = r.model.arch, r.layout.ring
    if not arch.has_sliding:
        return None
    if ring:
        back_N = (step_col - jnp.arange(ring, dtype=jnp.int32)) % ring
        return (back_N[None, :] < (n_S + plen_S)[:, None])[:, None]
    back_SxC = (n_S[:, None] - 1 - off_SxC) % r.cols
    return (valid_SxC & (back_SxC < arch.sliding_window))[:, None]


def _decode(s: _Loop, r: _Replica) -> _Loop:
    """Feed every slot's last token (one decode step) and draw its next."""
    layout, T, cols, b = r.layout, r.T, r.cols, r.layout.rows
    cos_SxR, sin_SxR = r.rope_SxR
    live_S = s.row_S >= 0
    row_S = jnp.maximum(s.row_S, 0)
    n_S = s.n_S
    plen_S = r.len_B[row_S]
    # Offset of each column from the slot's token 0: tokens fed so far, then the prompt.
    off_SxC = (r.col_C - s.start_S[:, None]) % cols
    valid_SxC = (off_SxC < n_S[:, None]) | (off_SxC >= cols - plen_S[:, None])
    pos_S = plen_S + n_S - 1
    # Every cache writes column (W + steps) modulo its own columns (`_unrolled_layers`).
    step_col = layout.width + s.steps
    layers = r.layers
    if layers is None and layout.layer_caches:
        layers = r.model.unstack_layers()
    hidden_Sx1xD, cache = r.model(
        s.ids_S[:, None], None,
        cache=model_cache(layout, s.ks, s.vs, step_col, jnp.where(live_S, plen_S + n_S, 0)),
        mask_BxLxS=valid_SxC[:, None], layers=layers,
        window_mask_BxLxS=_window_mask(valid_SxC, off_SxC, n_S, plen_S, step_col, r),
        rope=(cos_SxR[pos_S][:, None], sin_SxR[pos_S][:, None]), ops=r.backend.ops)
    t_S = jnp.minimum(n_S, T - 1)
    d = sample_uniform(r.backend.logits(hidden_Sx1xD[:, 0], r.unembed), r.u_BxTx2[row_S, t_S],
                       r.settings)
    at_S = jnp.where(live_S, row_S, b)  # out of range: dropped
    n1_S = n_S + 1
    fin_S = live_S & (_stops(d.ids_B, r.stop_S) | (n1_S >= T))
    ks, vs = cache_arrays(cache)
    return replace(
        s, ks=ks, vs=vs, row_S=jnp.where(fin_S, -1, s.row_S),
        n_S=jnp.where(live_S, n1_S, n_S), ids_S=d.ids_B,
        completion_BxT=s.completion_BxT.at[at_S, t_S].set(d.ids_B, mode="drop"),
        logp_BxT=s.logp_BxT.at[at_S, t_S].set(d.logp_B, mode="drop"),
        logp_model_BxT=s.logp_model_BxT.at[at_S, t_S].set(d.logp_model_B, mode="drop"),
        lengths_B=s.lengths_B.at[jnp.where(fin_S, row_S, b)].set(n1_S, mode="drop"),
        steps=s.steps + 1, live_steps=s.live_steps + jnp.sum(live_S, dtype=jnp.int32))


def _prefill_next(s: _Loop, r: _Replica) -> _Loop:
    """The store takes the next `store_rows` prompts (one prefill); token 0 of their rows."""
    layout, chunk_rows = r.layout, r.chunk_rows
    chunk = s.chunk + 1
    n = layout.store_rows
    prompts = jax.lax.dynamic_slice_in_dim(r.prompt_NxW, chunk * n, n, 0)
    lens = jax.lax.dynamic_slice_in_dim(r.len_N, chunk * n, n, 0)
    sk, sv, logits_NxV = prefill_kv(r.model, prompts, lens, r.rope_SxR, layout)
    rows = chunk * chunk_rows + jnp.arange(chunk_rows, dtype=jnp.int32)
    u_Rx2 = jax.lax.dynamic_slice_in_dim(r.u_BxTx2[:, 0], chunk * chunk_rows, chunk_rows, 0)
    d = group_draws(logits_NxV, u_Rx2, r.src_B[rows] - chunk * n, layout.group_size,
                    r.settings)
    ended_R = _ended_at_0(d.ids_B, r.stop_S, r.T)
    return replace(
        s, store_k=sk, store_v=sv, chunk=chunk,
        completion_BxT=s.completion_BxT.at[rows, 0].set(d.ids_B),
        logp_BxT=s.logp_BxT.at[rows, 0].set(d.logp_B),
        logp_model_BxT=s.logp_model_BxT.at[rows, 0].set(d.logp_model_B),
        lengths_B=s.lengths_B.at[rows].set(jnp.where(ended_R, 1, 0)))

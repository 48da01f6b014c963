"""Multi-turn generation that keeps each episode's KV cache across its turns.

    EpisodeCache.start(B): every layer's cache of S = P + E + R columns per row, empty
    turn(new ids of each open episode (n_B of them), key):
        new ids ──extend: pieces of <= Q columns (Q a power of two within the room of every
            row the piece writes), row b's piece written at its own columns
            [end_b, end_b + Q)──> end_b += n_b; the logits after each row's last new token
        ──decode (one while loop): token 0 from those logits; each step feeds every open
            row's last token at column end_b (end_b += 1) and draws the next, until every
            row drew a stop id or R tokens──> replies (ids, both log-probs, lengths)
    advance(feeds {slot: new ids, draw row, turn, fresh}, key, steps):   (schedule=refill)
        each fed slot's ids ──extend (a fresh slot from column 0)──> its reply begins: token 0
        ──chunk (one while loop of at most `steps` steps): every slot whose reply is
            running feeds its last token and draws its next, at its own token index──>
            the replies that ended in it (stop id or R tokens); the others run on next call

Row b's columns hold its transcript's tokens in order from column 0 (column = position), so
the causal rule of the model's cache is the token order; a row's piece is right-padded, and
the pad columns past its end are overwritten by its next tokens before anything reads them.
No piece writes over a column a row holds: a piece fed to a few rows runs on those rows
alone (`piece_rows`: gathered, written back), a piece on every row is no wider than the room
of any row still to be read (a vmapped write past a row's last column would be clamped back
onto its tokens). The pieces' shapes are powers of two from a set fixed by the caches' size
(`extend_shapes`), so the extend programs a run compiles are bounded by its plan.
A turn prefills only what an episode gained since its last turn: the last token of its reply
(drawn, never fed), the environment's messages and the next generation prompt; turn 0 its
opening. Each row writes at its own column (the model's one-sequence cache under `vmap`).

Draws use uniforms keyed by (key, row, token index), as the slot engine's (`engine`): a row's
reply depends on its transcript and the key, not on the other rows. `advance` keys a slot's
reply by its episode's row and turn (`fold_in(key, turn)`, as `turn` is given), so an episode
draws what it draws in `turn`, whichever slot holds it and whatever the other slots do. Rows
split over the mesh's `batch_axis` (the cache too); parameters keep their sharding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from compiler.axes import MeshAxis
from locojax.model import LayerKVCache, ModelArch
from locojax.rollout.backend import XLA
from locojax.rollout.engine import _on_mesh, _platform
from locojax.rollout.prefill import row_uniforms
from locojax.rollout.sampler import SamplingSettings, sample_uniform


def _forward(model, layers, ids_BxC, k_BxKxhdxS, v_BxKxSxhd, end_B):
    """The model on each row's C new tokens, written at that row's own columns from end_b,
    over its unrolled `layers` (`Qwen3.unstack_layers`): (hidden_BxCxD, keys, values), one
    array per layer each. Per-layer caches keep each row's write in place (a stacked cache
    carried through the layer scan is copied whole by the TPU compiler when rows write at
    their own columns)."""
    width = ids_BxC.shape[1]

    def one(ids_C, ks, vs, end):
        cache = LayerKVCache(tuple(k[None] for k in ks), tuple(v[None] for v in vs), end)
        pos_1xC = (end + jnp.arange(width, dtype=jnp.int32))[None]
        hidden_1xCxD, cache = model(ids_C[None], pos_1xC, cache=cache, layers=layers,
                                    ops=XLA.ops)
        return (hidden_1xCxD[0], tuple(k[0] for k in cache.k_BxKxhdxS),
                tuple(v[0] for v in cache.v_BxKxSxhd))

    return jax.vmap(one)(ids_BxC, k_BxKxhdxS, v_BxKxSxhd, end_B)


@partial(jax.jit, static_argnames=("graphdef",), donate_argnums=(2, 3))
def _extend(params, ids_NxC, k, v, end_B, n_N, logits_BxV, rows_N, *, graphdef):
    """One piece of new tokens (row n's first n_n real, right-padded) on the cache rows
    `rows_N` (None: every row, in order; an index past the last row: a padding row, computed
    and dropped): the caches with them written at each row's own columns, and the logits
    after each row's last one (rows with n_n = 0, and rows not among `rows_N`, keep theirs).
    Rows not among `rows_N` are neither read nor written (their caches are not copied)."""
    model = nnx.merge(graphdef, params)
    if rows_N is None:
        hidden_NxCxD, k, v = _forward(model, model.unstack_layers(), ids_NxC, k, v, end_B)
    else:
        pick = partial(jnp.take, indices=rows_N, axis=0, mode="clip")
        hidden_NxCxD, k_N, v_N = _forward(model, model.unstack_layers(), ids_NxC,
                                          tuple(map(pick, k)), tuple(map(pick, v)),
                                          pick(end_B))
        k, v = ((a.at[rows_N].set(b, mode="drop") for a, b in zip(x, x_N, strict=True))
                for x, x_N in ((k, k_N), (v, v_N)))
        k, v = tuple(k), tuple(v)
    last_N = jnp.maximum(n_N - 1, 0)
    hidden_NxD = jnp.take_along_axis(hidden_NxCxD, last_N[:, None, None], axis=1)
    new_NxV = model.logits(hidden_NxD)[:, 0]
    if rows_N is None:
        return k, v, jnp.where((n_N > 0)[:, None], new_NxV, logits_BxV)
    old_NxV = jnp.take(logits_BxV, rows_N, axis=0, mode="clip")
    return k, v, logits_BxV.at[rows_N].set(jnp.where((n_N > 0)[:, None], new_NxV, old_NxV),
                                           mode="drop")


@partial(jax.jit, static_argnames=("settings",), donate_argnums=(0,))
def _start_uniforms(u_BxRx2, key, start_B, turn_B, row_B, *, settings):
    """The uniforms of the replies that begin: row b's from (fold_in(key, turn_b), row_b)
    (`row_uniforms`, as `turn` keys its rows), the others' kept."""
    reply = u_BxRx2.shape[1]
    new_BxRx2 = jax.vmap(lambda t, r: row_uniforms(jax.random.fold_in(key, t), r[None],
                                                   reply)[0])(turn_B, row_B)
    return jnp.where(start_B[:, None, None], new_BxRx2, u_BxRx2)


@partial(jax.jit, static_argnames=("graphdef", "settings", "hoist", "steps"),
         donate_argnums=(1, 2, 7))
def _chunk(params, k, v, end_B, logits_BxV, start_B, u_BxRx2, state, *, graphdef, settings,
           hoist: bool, steps: int):
    """Rows in `start_B` begin a reply (token 0 from `logits_BxV`); then at most `steps` steps
    of every running row, each at its own token index. `state` = (t_B tokens drawn, last_B,
    running_B, ids_BxR, logp_BxR, logp_model_BxR), as returned: (keys, values, end_B, state,
    (steps run, rows' steps that drew a token)). A row runs until it draws a stop id or its
    R-th token. `hoist`: the layers' weights sliced out of their stacks once before the loop
    (a copy of them: faster on a CPU), else in every step (which the TPU compiler reads in
    place). `turn` runs it over whole replies (`steps` = R), `advance` in chunks."""
    rows, reply = u_BxRx2.shape[:2]
    stops = jnp.asarray(settings.stop_ids or (-1,), jnp.int32)
    t_B, last_B, run_B, ids_BxR, logp, logp_model = state
    first = sample_uniform(logits_BxV, u_BxRx2[:, 0], settings)
    begin = start_B[:, None]
    zeros = jnp.zeros((rows, reply), jnp.float32)
    ids_BxR = jnp.where(begin, jnp.full_like(ids_BxR, settings.pad_id).at[:, 0].set(first.ids_B),
                        ids_BxR)
    logp = jnp.where(begin, zeros.at[:, 0].set(first.logp_B), logp)
    logp_model = jnp.where(begin, zeros.at[:, 0].set(first.logp_model_B), logp_model)
    t_B = jnp.where(start_B, 1, t_B)
    last_B = jnp.where(start_B, first.ids_B, last_B)
    run_B = jnp.where(start_B, ~jnp.isin(first.ids_B, stops) & (reply > 1), run_B)
    model = nnx.merge(graphdef, params)
    hoisted = model.unstack_layers() if hoist else None
    at = jnp.arange(rows)

    def more(s):
        return (s[0] < steps) & jnp.any(s[6])

    def step(s):
        i, k, v, end_B, t_B, last_B, run_B, ids_BxR, logp, logp_model, live = s
        layers = hoisted if hoist else model.unstack_layers()
        hidden_Bx1xD, k, v = _forward(model, layers, last_B[:, None], k, v, end_B)
        col_B = jnp.minimum(t_B, reply - 1)
        u_Bx2 = jnp.take_along_axis(u_BxRx2, col_B[:, None, None], axis=1)[:, 0]
        draw = sample_uniform(model.logits(hidden_Bx1xD)[:, 0], u_Bx2, settings)
        put = lambda x, new: x.at[at, col_B].set(jnp.where(run_B, new, x[at, col_B]))  # noqa: E731
        t_B = t_B + run_B
        return (i + 1, k, v, end_B + run_B, t_B, jnp.where(run_B, draw.ids_B, last_B),
                run_B & ~jnp.isin(draw.ids_B, stops) & (t_B < reply), put(ids_BxR, draw.ids_B),
                put(logp, draw.logp_B), put(logp_model, draw.logp_model_B),
                live + jnp.sum(run_B, dtype=jnp.int32))

    zero = jnp.zeros((), jnp.int32)
    out = jax.lax.while_loop(more, step, (zero, k, v, end_B, t_B, last_B, run_B, ids_BxR, logp,
                                          logp_model, zero))
    return out[1], out[2], out[3], out[4:10], (out[0], out[10])


@dataclass(frozen=True)
class Feed:
    """What a slot takes before its next reply (`EpisodeCache.advance`)."""

    ids: tuple[int, ...]
    """Its episode's tokens the cache has not been fed (at least one)."""
    row: int
    """The row its episode draws as (its index among the host's episodes)."""
    turn: int
    """The reply's turn: its draws are keyed by `fold_in(key, turn)`."""
    fresh: bool = False
    """A new episode: the slot's columns start again from 0."""


@dataclass(frozen=True)
class Reply:
    """One turn's replies, as numpy arrays (inactive rows: length 0)."""

    ids_BxR: np.ndarray
    logp_BxR: np.ndarray
    """float32 log-probs under the sampling distribution."""
    logp_model_BxR: np.ndarray
    """float32 log-probs under the model's softmax at the sampling temperature."""
    lengths_B: np.ndarray
    """int32 tokens of each reply, its stop token included."""


GATHERED_SHARE = 8
"""A piece fed to at most 1 / GATHERED_SHARE of the rows runs on those rows alone (their
caches gathered, so at most that share of the caches is copied); a larger one on every row."""


def piece_rows(fed: int, rows: int) -> int:
    """Rows a piece fed to `fed` of `rows` rows runs on: the power of two covering `fed`
    where that is at most rows / GATHERED_SHARE (the rows gathered), else every row."""
    n = 1 << max(fed - 1, 0).bit_length()
    return n if n * GATHERED_SHARE <= rows else rows


def piece_width(rem_B: np.ndarray, end_B: np.ndarray, width: int,
                keep_B: np.ndarray | None = None) -> int:
    """Columns of the next extend piece: the power of two covering the longest remainder,
    halved until every row it writes (the rows with tokens left, and the rows of `keep_B`:
    those a piece on every row writes whose columns must stay) has that many columns of
    room. A kept row has at least one column of room."""
    guard = rem_B > 0 if keep_B is None else (rem_B > 0) | keep_B
    room = int((width - end_B[guard]).min())
    q = 1 << max(int(rem_B.max()) - 1, 0).bit_length()
    while q > room:
        q //= 2
    return q


def extend_shapes(rows: int, width: int) -> frozenset[tuple[int, int]]:
    """Every (rows, columns) a piece of `EpisodeCache._feed` on caches of `rows` rows (the
    mesh's padding included) and `width` columns can take: the compiled extend programs of
    a run are among these, whatever its episodes feed."""
    counts = {piece_rows(n, rows) for n in range(1, rows + 1)}
    widths = [1 << i for i in range(width.bit_length()) if 1 << i <= width]
    return frozenset((r, q) for r in counts for q in widths)


@dataclass
class EpisodeCache:
    """The KV caches of one batch of episodes across their turns (see the module's picture).

    `width` S: columns per row, at least an episode's P + E tokens plus a reply's R (the plan's
    `max_prompt_len + max_episode_len + max_response_len`). `settings`: one reply's sampling
    (max_new_tokens: R). With a `mesh`, rows split over `batch_axis`."""

    graphdef: nnx.GraphDef
    params: nnx.State
    settings: SamplingSettings
    width: int
    mesh: Mesh | None = None
    batch_axis: MeshAxis = MeshAxis.REPLICA
    _k: tuple[jax.Array, ...] = field(default=(), repr=False)
    """Keys, one array per layer (rows x kv heads x head dim x columns)."""
    _v: tuple[jax.Array, ...] = field(default=(), repr=False)
    """Values, one array per layer (rows x kv heads x columns x head dim)."""
    rows: int = 0
    """Episodes of the batch (`start`)."""
    first_row: int = 0
    """The row whose uniforms episode 0 draws with (`start`)."""
    end_B: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    """Columns each row holds (its transcript's tokens fed so far), the mesh's padding rows
    included."""
    _reply: tuple = field(default=(), repr=False)
    """`advance`'s replies in progress: the uniforms and `_chunk`'s state of every row."""
    running: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    """Rows whose reply `advance` has begun and not yet ended."""
    slot_steps: int = 0
    """Rows x steps the decode loops ran since `start` (each step after a reply's first
    token; the mesh's padding rows included)."""
    live_steps: int = 0
    """Of those, the steps of rows whose reply was running (the rest: rows waiting for an
    environment, done or empty)."""
    arch: ModelArch = field(init=False)
    dtype: np.dtype = field(init=False)
    """The caches' dtype: the rollout weights'."""

    def __post_init__(self):
        if self.mesh is not None:
            self.params = _on_mesh(self.params, self.mesh)
        self.arch = nnx.merge(self.graphdef, self.params).arch
        self.dtype = jax.tree.leaves(self.params)[0].dtype

    @property
    def sharding(self) -> NamedSharding | None:
        """Rows first, split over the batch axis (None without a mesh)."""
        return None if self.mesh is None else NamedSharding(self.mesh, P(self.batch_axis))

    def _rows(self, x):
        """`x` on the device(s), rows first, split over the batch axis."""
        return jnp.asarray(x) if self.mesh is None else jax.device_put(x, self.sharding)

    def padded(self, rows: int) -> int:
        """`rows` and the rows that sit every turn out up to a multiple of the mesh's
        `batch_axis` (the rows split over it)."""
        replicas = 1 if self.mesh is None else self.mesh.shape.get(self.batch_axis, 1)
        return rows + -rows % replicas

    def cache_shapes(self, rows: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(keys, values) shapes of one layer's cache of `rows` rows."""
        a = self.arch
        return ((rows, a.num_kv_heads, a.head_dim, self.width),
                (rows, a.num_kv_heads, self.width, a.head_dim))

    def start(self, rows: int, first_row: int = 0) -> None:
        """Empty caches for `rows` episodes (and the mesh's padding rows, `padded`). Episode
        b draws as row `first_row + b` (a later wave's episodes draw apart from the first's)."""
        self.rows, self.first_row = rows, first_row
        rows = self.padded(rows)
        k_shape, v_shape = self.cache_shapes(rows)
        # One buffer a layer each: every one is donated.
        self._k = tuple(jnp.zeros(k_shape, self.dtype, device=self.sharding)
                        for _ in range(self.arch.num_layers))
        self._v = tuple(jnp.zeros(v_shape, self.dtype, device=self.sharding)
                        for _ in range(self.arch.num_layers))
        self.end_B = np.zeros(rows, np.int32)
        self.running = np.zeros(rows, bool)
        self.slot_steps = self.live_steps = 0
        u = jnp.zeros((rows, self.settings.max_new_tokens, 2), jnp.float32, device=self.sharding)
        self._reply = (u, self._no_replies(rows))

    def _no_replies(self, rows: int) -> tuple:
        """`_chunk`'s state of `rows` rows with no reply: nothing drawn, ids all padding."""
        reply, pad = self.settings.max_new_tokens, self.settings.pad_id
        ints = jnp.full((rows, reply), pad, jnp.int32, device=self.sharding)
        floats = (jnp.zeros((rows, reply), jnp.float32, device=self.sharding) for _ in range(2))
        return (*(jnp.zeros(rows, d, device=self.sharding)
                  for d in (jnp.int32, jnp.int32, jnp.bool_)), ints, *floats)

    def turn(self, new: list[list[int]], key: jax.Array) -> Reply:
        """Feed each row's `new` ids (empty: the row sits this turn out) and draw its reply.
        ValueError when a row's ids and a reply would not fit in `width`."""
        given, rows, reply = len(new), len(self.end_B), self.settings.max_new_tokens
        if given != self.rows:
            raise ValueError(f"{given} rows given to the caches of {self.rows} episodes")
        if not rows:
            empty = np.zeros((0, reply), np.float32)
            return Reply(empty.astype(np.int32), empty, empty, np.zeros(0, np.int32))
        new = [*new, *[[]] * (rows - given)]
        n_B = np.array([len(x) for x in new], np.int32)
        over = np.flatnonzero((n_B > 0) & (self.end_B + n_B + reply - 1 > self.width))
        if over.size:
            b = int(over[0])
            raise ValueError(f"episode {b}: {self.end_B[b]} + {n_B[b]} tokens and a reply of "
                             f"{reply} do not fit in {self.width} columns")
        logits = self._feed(new, n_B)
        u = row_uniforms(key, self.first_row + jnp.arange(rows, dtype=jnp.int32), reply)
        state = self._decode(logits, n_B > 0, self._rows(u), self._no_replies(rows), reply)
        lengths, _, _, ids, logp, logp_model = (np.asarray(x)[:given] for x in state)
        return Reply(ids.astype(np.int32), logp.astype(np.float32),
                     logp_model.astype(np.float32), lengths.astype(np.int32))

    def _decode(self, logits_BxV: jax.Array, start_B: np.ndarray, u_BxRx2: jax.Array,
                state: tuple, steps: int) -> tuple:
        """`_chunk` on the caches: the rows in `start_B` begin their replies, every running
        one is decoded for at most `steps` steps; `end_B` and the loop's counts taken (rows x
        steps, running rows' steps). The replies' state after it."""
        self._k, self._v, end_B, state, (ran, live) = _chunk(
            self.params, self._k, self._v, self._rows(self.end_B), logits_BxV,
            self._rows(start_B), u_BxRx2, state, graphdef=self.graphdef,
            settings=self.settings, hoist=self._hoist(), steps=steps)
        self.end_B = np.array(end_B, np.int32)
        self.slot_steps += int(ran) * len(self.end_B)
        self.live_steps += int(live)
        return state

    def _feed(self, new: list[list[int]], n_B: np.ndarray) -> jax.Array:
        """Row b's `new[b]` written at its columns from `end_B[b]` (pieces of `piece_width`
        on `piece_rows` rows); the logits after each fed row's last token (zeros elsewhere).
        No piece writes a column another row holds: a piece on every row keeps within the
        room of the rows still to be read (running, or with room for another feed)."""
        rows = len(self.end_B)
        logits = jnp.zeros((rows, self.arch.vocab), jnp.float32, device=self.sharding)
        done = np.zeros(rows, np.int32)
        keep_B = self.running | ((self.end_B > 0)
                                 & (self.end_B <= self.width - self.settings.max_new_tokens))
        while (rem := n_B - done).max() > 0:
            fed = np.flatnonzero(rem > 0)
            n = piece_rows(len(fed), rows)
            q = piece_width(rem, self.end_B, self.width, keep_B if n == rows else None)
            take = np.minimum(rem, q)
            index = fed if n < rows else np.arange(rows)
            piece = np.full((n, q), self.settings.pad_id, np.int32)
            for j, b in enumerate(index):
                piece[j, :take[b]] = new[b][done[b]:done[b] + take[b]]
            at = np.full(n, rows, np.int32)  # past the last row: padding, dropped
            at[:len(index)] = index
            self._k, self._v, logits = self._extend(piece, at, take, logits, n == rows)
            self.end_B = self.end_B + take
            done = done + take
        return logits

    def _extend(self, piece: np.ndarray, at: np.ndarray, take: np.ndarray,
                logits: jax.Array, every: bool) -> tuple:
        """`_extend` of one piece: on every row (`every`, rows split over the mesh) or on the
        rows `at` alone."""
        if every:
            return _extend(self.params, self._rows(piece), self._k, self._v,
                           self._rows(self.end_B), self._rows(take), logits, None,
                           graphdef=self.graphdef)
        return _extend(self.params, jnp.asarray(piece), self._k, self._v,
                       self._rows(self.end_B), jnp.asarray(take[np.minimum(at, len(take) - 1)]
                                                           * (at < len(take))),
                       logits, jnp.asarray(at), graphdef=self.graphdef)

    def advance(self, feeds: dict[int, Feed], key: jax.Array, steps: int
                ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Feed each slot in `feeds` (slots: rows of `start`) and begin its reply, then decode
        every running reply for at most `steps` steps (see the module's picture): the replies
        that ended, slot -> (ids, logp, logp_model) of its tokens. ValueError for a slot out
        of range, one whose reply is running, or one whose ids and a reply would not fit."""
        rows, reply = len(self.end_B), self.settings.max_new_tokens
        bad = [s for s in feeds if not 0 <= s < self.rows or self.running[s]]
        if bad:
            raise ValueError(f"slot {bad[0]} cannot take tokens: out of the {self.rows} slots "
                             "or its reply is running")
        new, n_B = [[] for _ in range(rows)], np.zeros(rows, np.int32)
        turn_B, row_B = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
        for s, f in feeds.items():
            if f.fresh:
                self.end_B[s] = 0
            new[s], n_B[s], turn_B[s], row_B[s] = list(f.ids), len(f.ids), f.turn, f.row
            if self.end_B[s] + n_B[s] + reply - 1 > self.width:
                raise ValueError(f"slot {s}: {self.end_B[s]} + {n_B[s]} tokens and a reply of "
                                 f"{reply} do not fit in {self.width} columns")
        start_B = n_B > 0
        if not (start_B.any() or self.running.any()):
            return {}
        logits = self._feed(new, n_B)
        u, state = self._reply
        if start_B.any():
            u = _start_uniforms(u, key, self._rows(start_B), self._rows(turn_B),
                                self._rows(row_B), settings=self.settings)
        state = self._decode(logits, start_B, u, state, steps)
        self._reply = (u, state)
        before = self.running | start_B
        self.running = np.array(state[2], bool)
        ended = np.flatnonzero(before & ~self.running)
        if not ended.size:
            return {}
        n = np.asarray(state[0])[ended]
        ids, logp, logp_model = (np.asarray(x[jnp.asarray(ended)]) for x in state[3:])
        return {int(s): (ids[j, :n[j]].astype(np.int32), logp[j, :n[j]].astype(np.float32),
                         logp_model[j, :n[j]].astype(np.float32))
                for j, s in enumerate(ended)}

    def _hoist(self) -> bool:
        """Whether the decode loop slices the layers out of their stacks once (a CPU)."""
        return _platform(self.params, self.mesh) == "cpu"


def lower_programs(graphdef, params, settings: SamplingSettings, *, rows: int, width: int,
                   opening: int, mesh: Mesh | None = None,
                   batch_axis: MeshAxis = MeshAxis.REPLICA,
                   platforms: tuple[str, ...] | None = None, chunk: int = 0):
    """The lowered programs of a batch's turns, nothing run: turn 0's extend (every row's
    opening, `opening` columns, into caches of `width`) and the decode loop (a whole reply's,
    or `chunk` > 0: `advance`'s chunk of at most `chunk` steps). `params` may be
    `jax.ShapeDtypeStruct`s with shardings (compile-only devices); `platforms` lowers for
    those platforms rather than the mesh's devices'. (extend, decode)."""
    cache = EpisodeCache(graphdef, params, settings, width, mesh=mesh, batch_axis=batch_axis)
    rows = cache.padded(rows)

    def struct(shape, dt):  # rows first, split over the batch axis
        return jax.ShapeDtypeStruct(shape, dt, sharding=cache.sharding)

    k_shape, v_shape = cache.cache_shapes(rows)
    k = (struct(k_shape, cache.dtype),) * cache.arch.num_layers
    v = (struct(v_shape, cache.dtype),) * cache.arch.num_layers
    ints, logits = struct((rows,), jnp.int32), struct((rows, cache.arch.vocab), jnp.float32)
    extend = _extend.trace(cache.params, struct((rows, opening), jnp.int32), k, v, ints, ints,
                           logits, None, graphdef=graphdef)
    flags, reply = struct((rows,), jnp.bool_), settings.max_new_tokens
    u = struct((rows, reply, 2), jnp.float32)
    state = (ints, ints, flags, struct((rows, reply), jnp.int32),
             *(struct((rows, reply), jnp.float32),) * 2)
    decode = _chunk.trace(cache.params, k, v, ints, logits, flags, u, state, graphdef=graphdef,
                          settings=settings, hoist=cache._hoist(), steps=chunk or reply)
    if platforms is None:
        return extend.lower(), decode.lower()
    return (extend.lower(lowering_platforms=platforms),
            decode.lower(lowering_platforms=platforms))

"""Static facts of one generation, shared by its two programs (prefill, slots).

`Layout` is a jit static argument: widths, rows and store entries per replica, the slots,
the schedule, and which mesh axes split rows (replica) and the KV cache's kv heads (tensor).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from compiler.axes import MeshAxis
from locojax.model import KVCache, LayerKVCache


@dataclass(frozen=True)
class Layout:
    """Static facts of one generation: widths, group, slots, sharding (a jit static arg)."""

    width: int
    """Padded prompt length W."""
    rows: int
    """Rows per replica."""
    store_rows: int
    """Prompt KV store entries per replica (all its prompts, or a divisor of them: `chunked`)."""
    group_size: int
    shared: bool
    """Store entry of row r: r // G (shared prefill) or r (repeated)."""
    store_sharded: bool
    """The store holds this replica's prompts only (else every prompt)."""
    slots: int
    refill: bool
    kv_dtype: str
    stacked: bool = False
    """The layers' weights stay stacked, read in place (no per-layer copy of them;
    accelerators), else unrolled over per-layer copies (a CPU, the kernels)."""
    ring: int = 0
    """Columns of a sliding layer's slot cache when its window is narrower than a slot's
    W + T (`ring_columns`): those layers keep only their window, on a ring of their own;
    0: every layer's cache spans the slot."""
    mesh: Mesh | None = None
    batch_axis: MeshAxis | None = None
    """Mesh axis the rows split over (None: one replica)."""
    tensor_axis: MeshAxis | None = None
    """Mesh axis the KV cache's kv heads split over (None: not split)."""

    @property
    def chunked(self) -> bool:
        """The store holds some of the replica's prompts at a time: program 1 prefills the
        first `store_rows`, and the slot loop prefills each next `store_rows` once every row
        of the stored ones has entered a slot."""
        return self.shared and self.store_sharded and self.store_rows * self.group_size < self.rows

    @property
    def layer_caches(self) -> bool:
        """One cache array per layer (`LayerKVCache`, the layers unrolled), else one stacked
        array scanned with the stacked weights (`KVCache`). Unstacked weights, or caches of
        two widths (`ring`), take per-layer arrays; stacked weights are then sliced per
        step, in place."""
        return not self.stacked or self.ring > 0

    @property
    def manual(self) -> bool:
        """Rows split over replicas, each running its own program (shard_map)."""
        return self.mesh is not None and self.batch_axis is not None


def ring_columns(arch, cols: int) -> int:
    """`Layout.ring` of a model with `cols`-column slots: its sliding window where that is
    narrower (a query reads its own and the window - 1 tokens before it, so a ring of window
    columns, written before it is read, holds all of them), else 0."""
    window = arch.sliding_window if arch.has_sliding else 0
    return window if 0 < window < cols else 0


def kv_constrain(x, layout: Layout):
    """Keep a cache array split by kv head where the plan splits it."""
    if layout.tensor_axis is None:
        return x
    axis = 1 if layout.layer_caches else 2
    spec = P(*([None] * axis), layout.tensor_axis, *([None] * (x.ndim - axis - 1)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(layout.mesh, spec))


def replica_row0(layout: Layout):
    """Global index of this replica's first row and first prompt."""
    if not layout.manual:
        return jnp.int32(0), jnp.int32(0)
    r = jax.lax.axis_index(layout.batch_axis)
    # A chunked store holds some of the replica's rows // G prompts at a time.
    prompts = layout.rows // layout.group_size if layout.chunked else layout.store_rows
    store0 = r * prompts if layout.store_sharded else 0
    return r * layout.rows, store0


def store_index(rows_B, store0, layout: Layout):
    """Entry of the prompt KV store (on this replica) that each global row reads."""
    return (rows_B // layout.group_size if layout.shared else rows_B) - store0


def cache_widths(layout: Layout, arch, cols: int, ring: bool = False) -> tuple[int, ...]:
    """Columns of each layer's cache of `cols`-column rows: with `ring`, a sliding layer's
    `layout.ring` where the layout has one (the slot loop's caches; the prompt store keeps
    every column)."""
    narrow = layout.ring if ring and layout.ring else cols
    return tuple(narrow if sliding else cols for sliding in arch.sliding_layers)


def zero_cache(layout: Layout, arch, rows: int, cols: int, ring: bool = False):
    """(keys, values) zeros in the KV dtype, split by kv head: per-layer tuples (keys
    BxKxhdxS, values BxKxSxhd; S from `cache_widths`) or, stacked, one NxBxKxSxhd array
    each."""
    dt = jnp.dtype(layout.kv_dtype)
    k, hd, n = arch.num_kv_heads, arch.head_dim, arch.num_layers
    if not layout.layer_caches:
        shape = (n, rows, k, cols, hd)
        return ((kv_constrain(jnp.zeros(shape, dt), layout),),
                (kv_constrain(jnp.zeros(shape, dt), layout),))
    widths = cache_widths(layout, arch, cols, ring)
    return (tuple(kv_constrain(jnp.zeros((rows, k, hd, s), dt), layout) for s in widths),
            tuple(kv_constrain(jnp.zeros((rows, k, s, hd), dt), layout) for s in widths))


def cache_axes(layout: Layout) -> tuple[int, int, int]:
    """(row axis, keys' column axis, values' column axis) of the arrays `zero_cache` makes."""
    return (0, 3, 2) if layout.layer_caches else (1, 3, 3)


def model_cache(layout: Layout, ks, vs, end, live_B=None):
    """The model's cache holding (keys, values) from `zero_cache`, writing at `end`; a stacked
    one carries each row's live columns (`KVCache.live_B`) where they are given."""
    if layout.layer_caches:
        return LayerKVCache(ks, vs, end)
    return KVCache(ks[0], vs[0], end, live_B)


def cache_arrays(cache) -> tuple[tuple, tuple]:
    """(keys, values) of a model cache, as `zero_cache` lays them out."""
    if isinstance(cache, KVCache):
        return (cache.k_NxBxKxSxhd,), (cache.v_NxBxKxSxhd,)
    return cache.k_BxKxhdxS, cache.v_BxKxSxhd

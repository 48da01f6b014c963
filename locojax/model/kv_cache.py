"""Static-shape key/value cache for all layers, with one shared write index."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from compiler.axes import LogicalAxis as A
from locojax.model.arch import ModelArch

KV_CACHE_AXES: tuple[str, ...] = tuple(
    a.value for a in (A.LAYERS, A.BATCH, A.KV_HEADS, A.LENGTH, A.HEAD_DIM)
)
"""Logical axes of `KVCache.k_NxBxKxSxhd` and `KVCache.v_NxBxKxSxhd`."""


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class KVCache:
    """Keys and values of N layers for B sequences in S slots; slots [0, end) are written."""

    k_NxBxKxSxhd: jax.Array
    """Post-RoPE keys; heads before slots so attention reads them without a transpose."""
    v_NxBxKxSxhd: jax.Array
    """Values."""
    end: jax.Array
    """int32 scalar: the slot the next call writes first (shared by the whole batch)."""
    live_B: jax.Array | None = None
    """int32 per sequence, for a one-token step over a ring of slots (the rollout engine's):
    the slots it reads are the `live_B` ending at the one it writes (mod S, its own included),
    which `ModelOps.stacked_attention` reads without a dense mask. None: the mask decides."""

    @property
    def max_len(self) -> int:
        """Slots S per sequence."""
        return self.k_NxBxKxSxhd.shape[3]


def init_cache(arch: ModelArch, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache of `max_len` slots; `dtype` defaults to the model's dtype."""
    dtype = arch.jnp_dtype if dtype is None else dtype
    shape = (arch.num_layers, batch, arch.num_kv_heads, max_len, arch.head_dim)
    return KVCache(
        k_NxBxKxSxhd=jnp.zeros(shape, dtype),
        v_NxBxKxSxhd=jnp.zeros(shape, dtype),
        end=jnp.zeros((), jnp.int32),
    )


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LayerKVCache:
    """The same cache held as one array per layer, for a decode loop over unstacked layers.

    A layer then writes and reads its own array in place; slicing one layer out of the
    NxBxKxSxhd stack would copy it every step. Keys are stored transposed (slots last), so
    a step's query-key product is a plain matrix product over hd: with slots before hd it
    is a transposed-operand product, which XLA:CPU ran ~2.5x slower inside the decode loop.
    """

    k_BxKxhdxS: tuple[jax.Array, ...]
    """Post-RoPE keys, one array per layer, slots on the last axis."""
    v_BxKxSxhd: tuple[jax.Array, ...]
    """Values, one array per layer."""
    end: jax.Array
    """int32 scalar: the slot the next call writes first (shared by the whole batch)."""

    @property
    def max_len(self) -> int:
        """Slots S per sequence: the widest layer's (a sliding layer's ring may hold fewer)."""
        return max(k.shape[3] for k in self.k_BxKxhdxS)

    @classmethod
    def from_stacked(cls, cache: KVCache) -> LayerKVCache:
        """Split a stacked cache into per-layer arrays, keys transposed (one copy)."""
        n = cache.k_NxBxKxSxhd.shape[0]
        return cls(tuple(cache.k_NxBxKxSxhd[i].transpose(0, 1, 3, 2) for i in range(n)),
                   tuple(cache.v_NxBxKxSxhd[i] for i in range(n)), cache.end)

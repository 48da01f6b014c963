"""The policy's weights outside the train step: where they start, and the copies made of them.

    initial_params(host) -> params      `model.checkpoint` (Hugging Face) read straight onto
                                        the training shardings, or a random init from
                                        `run.seed` computed in place (the same on every host)
    seed_init(arch, seed, dtype)        that random init
    cast(params, dtype) -> params       a real copy in `dtype`, sharded like `params`
    rollout_params(host, params)        the weights cast once to the compute dtype, whole on
                                        this process's rollout mesh (CO's on-host reshard)
    host_copy(params, dtype)            {name: numpy array} of every parameter (DA slices,
                                        the HF export), from local shards when they cover it

Nothing here keeps a second full copy alive on its own: with one device and the compute
dtype equal to the master dtype, the rollout weights *are* the master weights (valid until
the next train step donates them; the loop makes new ones after every step), and host
copies are built one parameter at a time from the shards.
"""

from __future__ import annotations

from functools import partial
from math import prod

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

from locojax.model import Qwen3, flat_params, load_hf_params, split_params
from locojax.runtime.components import Host, rollout_shardings

Box = tuple[tuple[int, int], ...]


def initial_params(host: Host, dtype: str | None = None):
    """The weights training starts from, in `dtype` (default the master dtype; a LoRA base:
    the compute dtype), on the training shardings."""
    arch, dtype = host.model.arch, dtype or host.model.param_dtype
    if host.model.checkpoint is not None:
        return load_hf_params(host.model.checkpoint, arch, host.model.param_shardings, dtype)

    return jax.jit(partial(seed_init, arch, host.plan.run.seed, dtype),
                   out_shardings=host.model.param_shardings)()


def seed_init(arch, seed: int, dtype: str):
    """The random init of `seed` in `dtype` (traceable: `initial_params` computes it in
    place; `locojax-eval` rebuilds a LoRA run's base with it)."""
    return cast(split_params(Qwen3(arch, rngs=nnx.Rngs(seed)))[1], dtype)


def cast(params, dtype: str):
    """`params` as `dtype` (a new array even where the dtype is already `dtype`)."""
    return jax.tree.map(lambda x: jnp.array(x, dtype=dtype, copy=True), params)


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))


def _disjoint(a: Box, b: Box) -> bool:
    return any(hi1 <= lo2 or hi2 <= lo1 for (lo1, hi1), (lo2, hi2) in zip(a, b, strict=True))


def covers(shape: tuple[int, ...], boxes: set[Box]) -> bool:
    """Whether distinct `boxes` (start, stop per dim) tile the whole array exactly once."""
    volume = sum(prod(hi - lo for lo, hi in box) for box in boxes)
    listed = sorted(boxes)
    overlap = any(not _disjoint(a, b) for i, a in enumerate(listed) for b in listed[i + 1:])
    return volume == prod(shape) and not overlap


def _local_boxes(x: jax.Array) -> dict[Box, jax.Array]:
    """One shard per distinct box this process holds (replicas left out)."""
    boxes: dict[Box, jax.Array] = {}
    for shard in x.addressable_shards:
        boxes.setdefault(_box(shard.index, x.shape), shard.data)
    return boxes


def locally_whole(params) -> bool:
    """Whether this process's shards hold every element of every parameter."""
    return all(covers(x.shape, set(_local_boxes(x))) for x in jax.tree.leaves(params))


def _from_local_shards(x: jax.Array, dtype) -> np.ndarray:
    """A numpy copy of `x` from this process's shards; every element is written exactly once."""
    boxes = _local_boxes(x)
    if not covers(x.shape, set(boxes)):
        raise RuntimeError(f"this process's shards of a {x.shape} parameter do not cover it "
                           f"(boxes {sorted(boxes)}): the training mesh does not give each "
                           "host a whole copy")
    out = np.empty(x.shape, dtype)
    for box, data in boxes.items():
        out[tuple(slice(lo, hi) for lo, hi in box)] = np.asarray(data).astype(dtype, copy=False)
    return out


def host_copy(params, dtype: str) -> dict[str, np.ndarray]:
    """'/'-joined name -> a full numpy copy in `dtype` of every parameter (of a params state,
    or of a {name: array} mapping).

    From this process's shards where they cover the parameters (CO: FSDP within the host);
    otherwise an all-gather over processes, which every process must then call (DA trainers
    whose FSDP group spans hosts).
    """
    flat = ({name: var[...] for name, var in flat_params(params).items()}
            if isinstance(params, nnx.State) else dict(params))
    np_dtype = jnp.dtype(dtype)
    if locally_whole(flat):
        return {name: _from_local_shards(x, np_dtype) for name, x in flat.items()}
    gathered = multihost_utils.process_allgather(cast(flat, dtype), tiled=True)
    return {name: np.asarray(x) for name, x in gathered.items()}


def rollout_params(host: Host, params):
    """The training-layout weights in the compute dtype, in the plan's rollout layout on this
    process's rollout mesh (`components.rollout_shardings`).

    CO keeps a whole copy of the weights on every host (FSDP within the host), so the plan's
    transfer is an on-host reshard, built from this host's shards (checked to cover every
    element). With one process the reshard is one program per parameter; where nothing
    changes (same dtype, one device) the master arrays are returned as they are.
    """
    dtype = jnp.dtype(host.model.compute_dtype)

    def place(x: jax.Array, target: NamedSharding) -> jax.Array:
        if x.is_fully_addressable:
            if x.dtype == dtype:
                return jax.device_put(x, target)
            return _cast_to(x, dtype, target)
        return jax.device_put(_from_local_shards(x, dtype), target)

    return jax.tree.map(place, params, rollout_shardings(host, params))


@partial(jax.jit, static_argnums=(1, 2))
def _cast_to(x: jax.Array, dtype, sharding) -> jax.Array:
    return jax.lax.with_sharding_constraint(x.astype(dtype), sharding)

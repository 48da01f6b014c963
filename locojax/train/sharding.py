"""Shardings of the training state from the plan's per-parameter PartitionSpecs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from compiler.axes import MeshAxis


def param_shardings(
    mesh: Mesh, params: nnx.State, specs: Mapping[str, Sequence[str | Sequence[str] | None]]
) -> nnx.State:
    """`params` with each value replaced by NamedSharding(mesh, specs['a/b/c'])."""
    names = {"/".join(map(str, path)) for path, _ in nnx.to_flat_state(params)}
    if names != set(specs):
        raise ValueError(
            f"parameter specs do not match the model: missing {sorted(names - set(specs))}, "
            f"unexpected {sorted(set(specs) - names)}"
        )

    def sharding(path, var):
        spec = specs["/".join(map(str, path))]
        if len(spec) != len(var.shape):
            raise ValueError(f"{'/'.join(map(str, path))}: spec {spec} for shape {var.shape}")
        axes = (tuple(a) if isinstance(a, list | tuple) else a for a in spec)
        return var.replace(NamedSharding(mesh, PartitionSpec(*axes)))

    return nnx.map_state(sharding, params)


def batch_sharding(mesh: Mesh, axes: Sequence[MeshAxis] = (MeshAxis.DATA, MeshAxis.FSDP)
                   ) -> NamedSharding:
    """Leading (batch) dimension split over `axes`, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(tuple(axes)))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated over `mesh`."""
    return NamedSharding(mesh, PartitionSpec())


def global_batch(local_batch, sharding: NamedSharding):
    """One global array per leaf from each process's own rows (process order = row order; the
    global batch has every process's rows, one process's are placed as they are)."""
    def place(x):
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        shape = (x.shape[0] * jax.process_count(), *x.shape[1:])
        return jax.make_array_from_process_local_data(sharding, x, shape)

    return jax.tree.map(place, local_batch)

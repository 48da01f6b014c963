"""Orbax checkpoints of (params, optimizer state, JSON meta), restored onto given shardings.

Any pytree works (nnx.State of nnx.Param, plain dicts, optax states): it is flattened to a
dict of arrays keyed by its dotted key path, so the on-disk names do not depend on how
nnx or optax register their nodes, and restore rebuilds the caller's tree structure.
Every JAX process calls `save` and `restore`; Orbax coordinates the writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

PyTree = Any


def flatten_named(tree: PyTree) -> tuple[dict[str, Any], Any]:
    """({dotted key path: leaf}, treedef) of `tree`; the names are the on-disk keys."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    named = {jax.tree_util.keystr(path, simple=True, separator="."): x for path, x in leaves}
    if len(named) != len(leaves):
        raise ValueError("two leaves share one key path; cannot checkpoint this tree")
    return named, treedef


def _abstract(x: Any) -> jax.ShapeDtypeStruct:
    """Restore target of one leaf: its shape, dtype and sharding (single device if unknown)."""
    sharding = getattr(x, "sharding", None)
    if sharding is None:  # numpy leaves or bare ShapeDtypeStructs: put them on one device
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


class Checkpointer:
    """Keeps the newest `keep` checkpoints of a run under `directory` (async saves)."""

    def __init__(self, directory: Path, keep: int = 2, async_save: bool = True):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=True,
            # A run killed mid-save leaves a tmp dir; it is never listed as a step, and this
            # removes it when the next run opens the directory.
            cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, params: PyTree, opt_state: PyTree, meta: dict) -> None:
        """Start saving step `step`; device->host copies finish before this returns."""
        flat_params, _ = flatten_named(params)
        flat_opt, _ = flatten_named(opt_state)
        items = {"meta": ocp.args.JsonSave(dict(meta))}
        # Orbax refuses empty trees (e.g. plain SGD's EmptyState); leave such items out.
        for name, flat in (("params", flat_params), ("opt_state", flat_opt)):
            if flat:
                items[name] = ocp.args.StandardSave(flat)
        args = ocp.args.Composite(**items)
        # force: the loop decides when to save; Orbax's own interval policy stays out.
        self._manager.save(step, args=args, force=True)

    def wait(self) -> None:
        """Block until every started save is finished and committed."""
        self._manager.wait_until_finished()

    def latest_step(self) -> int | None:
        """Newest fully written step, or None; unfinished (tmp) saves are never listed."""
        self._manager.reload()
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Every fully written step, oldest first."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def restore(
        self, step: int, params_like: PyTree, opt_state_like: PyTree
    ) -> tuple[PyTree, PyTree, dict]:
        """(params, opt_state, meta) of `step`, shaped and sharded like the `*_like` trees."""
        like_params, params_def = flatten_named(params_like)
        like_opt, opt_def = flatten_named(opt_state_like)
        items = {"meta": ocp.args.JsonRestore()}
        for name, flat in (("params", like_params), ("opt_state", like_opt)):
            if flat:
                items[name] = ocp.args.StandardRestore({k: _abstract(x) for k, x in flat.items()})
        out = self._manager.restore(step, args=ocp.args.Composite(**items))
        params = jax.tree.unflatten(params_def, [out["params"][k] for k in like_params])
        opt_state = jax.tree.unflatten(opt_def, [out["opt_state"][k] for k in like_opt])
        return params, opt_state, dict(out["meta"])

    def close(self) -> None:
        """Wait for pending saves and release Orbax's background threads."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

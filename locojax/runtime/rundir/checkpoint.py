"""Orbax checkpoints of (params, optimizer state, JSON meta), restored onto given shardings.

Any pytree works (nnx.State of nnx.Param, plain dicts, optax states): it is flattened to a
dict of arrays keyed by its dotted key path, so the on-disk names do not depend on how
nnx or optax register their nodes, and restore rebuilds the caller's tree structure.
Every JAX process calls `save` and `restore`; Orbax coordinates the writes.

`restore_latest` resumes from the newest step that restores: a damaged step (truncated,
missing or corrupt file) is reported in one line and moved to `<dir>.unrestorable/`, and the
step before it is tried; when none restores, `NoCheckpointRestores` says so and nothing is
moved or deleted. Orbax stores no checksums and a flipped byte inside a compressed chunk can
decode to other numbers without an error, so each save also records a position-weighted sum
of every leaf's bits (one fused pass on device) and `restore` checks it.
"""

from __future__ import annotations

import gc
import logging
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from locojax.runtime.errors import NoCheckpointRestores

PyTree = Any


def flatten_named(tree: PyTree) -> tuple[dict[str, Any], Any]:
    """({dotted key path: leaf}, treedef) of `tree`; the names are the on-disk keys."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    named = {jax.tree_util.keystr(path, simple=True, separator="."): x for path, x in leaves}
    if len(named) != len(leaves):
        raise ValueError("two leaves share one key path; cannot checkpoint this tree")
    return named, treedef


CHECKSUMS = "_checksums"
"""Meta key of the saved leaves' bit sums (removed from the meta `restore` returns)."""


def _bit_sum(x: jax.Array) -> jax.Array:
    """Sum of the leaf's bits as uint32 words, each weighted by (index mod 65521) + 1."""
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_ or x.dtype.itemsize == 1:
        words = x.astype(jnp.uint32)
    elif x.dtype.itemsize == 2:
        words = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    else:  # 4 bytes: one word; 8 bytes: two
        words = jax.lax.bitcast_convert_type(x, jnp.uint32)
    words = words.reshape(-1)
    weights = jax.lax.iota(jnp.uint32, words.size) % jnp.uint32(65521) + jnp.uint32(1)
    return jnp.sum(words * weights, dtype=jnp.uint32)


@jax.jit
def _bit_sums(flat: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {k: _bit_sum(v) for k, v in flat.items()}


def checksums(flat: dict[str, Any]) -> dict[str, int]:
    """{name: bit sum} of a flattened tree (the same number on every host); one compiled
    pass per set of devices the leaves live on."""
    groups: dict[Any, dict[str, Any]] = {}
    for k, v in flat.items():
        devices = getattr(getattr(v, "sharding", None), "device_set", None)
        groups.setdefault(frozenset(devices) if devices else None, {})[k] = v
    sums = {}
    for group in groups.values():
        sums.update(jax.device_get(_bit_sums(group)))
    return {k: int(sums[k]) for k in flat}


def _reason(err: BaseException) -> str:
    """One short line of an Orbax / tensorstore error."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:240]


def _all_hosts(ok: bool) -> bool:
    """True when `ok` holds on every JAX process (each reads its own shards)."""
    if jax.process_count() == 1:
        return ok
    return bool(np.asarray(multihost_utils.process_allgather(np.array(ok))).all())


def _abstract(x: Any) -> jax.ShapeDtypeStruct:
    """Restore target of one leaf: its shape, dtype and sharding (single device if unknown)."""
    sharding = getattr(x, "sharding", None)
    if sharding is None:  # numpy leaves or bare ShapeDtypeStructs: put them on one device
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


class Checkpointer:
    """Keeps the newest `keep` checkpoints of a run under `directory` (async saves)."""

    def __init__(self, directory: Path, keep: int = 2, async_save: bool = True,
                 read_only: bool = False):
        self.directory = Path(directory).absolute()
        absl = logging.getLogger("absl")
        level = absl.level
        if read_only:  # Orbax warns that a read-only manager reads only: that is the point
            absl.setLevel(logging.ERROR)
        try:
            options = ocp.CheckpointManagerOptions(
                max_to_keep=None if read_only else keep,
                create=not read_only,
                # A run killed mid-save leaves a tmp dir; it is never listed as a step, and
                # this removes it when the next run opens the directory. A reader
                # (locojax-eval on a run that may be saving) leaves every directory as it is.
                cleanup_tmp_directories=not read_only,
                read_only=read_only,
                enable_async_checkpointing=async_save,
            )
            self._manager = ocp.CheckpointManager(self.directory, options=options)
        finally:
            absl.setLevel(level)

    def save(self, step: int, params: PyTree, opt_state: PyTree, meta: dict) -> None:
        """Start saving step `step`; device->host copies finish before this returns."""
        flat_params, _ = flatten_named(params)
        flat_opt, _ = flatten_named(opt_state)
        sums = {"params": checksums(flat_params), "opt_state": checksums(flat_opt)}
        items = {"meta": ocp.args.JsonSave({**meta, CHECKSUMS: sums})}
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
        meta = dict(out["meta"])
        for name, flat in (("params", like_params), ("opt_state", like_opt)):
            want = meta.get(CHECKSUMS, {}).get(name)  # absent in checkpoints of older versions
            got = checksums({k: out[name][k] for k in flat}) if flat and want is not None else {}
            bad = sorted(k for k in got if got[k] != want.get(k))
            if bad:
                raise ValueError(f"{name}.{bad[0]}: the restored bits differ from the saved "
                                 f"checksum ({len(bad)} leaves differ)")
        meta.pop(CHECKSUMS, None)
        params = jax.tree.unflatten(params_def, [out["params"][k] for k in like_params])
        opt_state = jax.tree.unflatten(opt_def, [out["opt_state"][k] for k in like_opt])
        return params, opt_state, meta

    def restore_latest(
        self, params_like: PyTree, opt_state_like: PyTree, log: Callable[[str], None] = print
    ) -> tuple[int, PyTree, PyTree, dict]:
        """(step, params, opt_state, meta) of the newest step that restores on every host;
        (0, the `*_like` trees, {}) when nothing was saved. Damaged newer steps are logged
        and moved aside; `NoCheckpointRestores` when none restores (nothing is moved)."""
        failed: list[tuple[int, str]] = []
        steps = self.all_steps()
        if len(steps) > 1:  # a read that fails may report late, from one of Orbax's threads
            _quiet_abandoned_reads(collect=False)
        for step in reversed(steps):
            try:
                params, opt_state, meta = self.restore(step, params_like, opt_state_like)
                why = ""
            except Exception as err:  # Orbax and tensorstore raise many types for bad files
                why = _reason(err)
                _quiet_abandoned_reads()
            if _all_hosts(not why):
                self._set_aside([s for s, _ in failed], log)
                return step, params, opt_state, meta
            failed.append((step, why or "failed on another host"))
            log(f"checkpoint of step {step} in {self.directory} does not restore ({failed[-1][1]})"
                "; trying the step before it")
        if failed:
            reasons = "; ".join(f"step {s}: {w}" for s, w in failed)
            raise NoCheckpointRestores(f"{self.directory}: no checkpoint restores ({reasons}); "
                                       "nothing was deleted")
        return 0, params_like, opt_state_like, {}

    def _set_aside(self, steps: list[int], log: Callable[[str], None]) -> None:
        """Move damaged steps out of Orbax's sight (a later save may reuse the number)."""
        if not steps:
            return
        aside = self.directory.with_name(self.directory.name + ".unrestorable")
        if jax.process_index() == 0:
            for step in steps:
                target = aside / str(step)
                n = 1
                while target.exists():
                    target, n = aside / f"{step}.{n}", n + 1
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(self.directory / str(step)), target)
                log(f"moved the damaged checkpoint of step {step} to {target}")
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("locojax checkpoint set aside")
        self._manager.reload()

    def close(self) -> None:
        """Wait for pending saves and release Orbax's background threads."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _from_io_stack(tb, names: tuple[str, ...] = ("orbax", "tensorstore", "asyncio")) -> bool:
    """True when a traceback passes through Orbax, tensorstore or asyncio's loop machinery
    (or through the files `names` match)."""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if any(n in name for n in names):
            return True
        tb = tb.tb_next
    return False


class _AbandonedReadTasks:
    """A filter of the `asyncio` logger: drops 'Task exception was never retrieved' reports
    of Orbax's or tensorstore's reads (the task's exception raised there)."""

    locojax_quiet_reads = True

    @staticmethod
    def filter(record) -> bool:
        exc = record.exc_info
        return not (exc and exc[2] is not None
                    and _from_io_stack(exc[2], names=("orbax", "tensorstore")))


def _quiet_abandoned_reads(collect: bool = True) -> None:
    """After a restore that failed, Orbax's reads of the damaged files are left as coroutines
    and callbacks that Python reports with a traceback whenever they are collected or their
    loop is gone ('Exception ignored in: <coroutine ...>', 'Event loop is closed'), at a time
    that depends on the garbage collector and the machine's load. The failure itself is
    already one line (`does not restore`): drop those late reports, pass on every other.
    A collected task whose exception nobody retrieved is reported through the `asyncio`
    logger instead ('Task exception was never retrieved'): a filter there drops those of
    Orbax's reads. Installed once per process: before restoring a run that has an older
    checkpoint to fall back to (a failing read's callbacks may report while it fails), or
    after a failed restore; `collect` then collects the failed read's coroutines."""
    previous_unraisable = sys.unraisablehook
    if getattr(previous_unraisable, "locojax_quiet_reads", False):
        if collect:
            gc.collect()
        return
    previous_thread = threading.excepthook

    def unraisable(report) -> None:
        code = getattr(report.object, "cr_code", None)
        from_io = code is not None and ("orbax" in code.co_filename
                                        or "tensorstore" in code.co_filename)
        if not (from_io or _from_io_stack(report.exc_traceback)):
            previous_unraisable(report)

    def thread(args) -> None:
        if not _from_io_stack(args.exc_traceback):
            previous_thread(args)

    unraisable.locojax_quiet_reads = True
    sys.unraisablehook, threading.excepthook = unraisable, thread
    logging.getLogger("asyncio").addFilter(_AbandonedReadTasks)
    if collect:
        gc.collect()  # the failed read's coroutines go now, while the hooks are in place

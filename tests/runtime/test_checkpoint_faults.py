"""A damaged latest checkpoint: reported in one line, moved aside, the step before it restored
bit-identically; when no step restores, one error line and nothing moved or deleted."""

import asyncio
import gc
import logging
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from locojax.runtime.errors import NoCheckpointRestores
from locojax.runtime.rundir.checkpoint import Checkpointer, _quiet_abandoned_reads

PARAMS = {"w": jnp.arange(64 * 64, dtype=jnp.float32).reshape(64, 64), "b": jnp.ones(64)}


def _saved(directory: Path) -> dict[int, dict]:
    """Steps 2 and 4 saved (params + 2 and + 4); returns what each holds."""
    opt = optax.adam(1e-2).init(PARAMS)
    held = {}
    with Checkpointer(directory, keep=2) as ckpt:
        for step in (2, 4):
            params = {k: v + step for k, v in PARAMS.items()}
            ckpt.save(step, params, opt, {"step": step})
            held[step] = params
    return held


def _largest_file(step_dir: Path) -> Path:
    return max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _truncate(step_dir: Path) -> None:
    path = _largest_file(step_dir / "params")
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 3)


def _bit_rot(step_dir: Path) -> None:
    path = _largest_file(step_dir / "params")
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 256] = bytes(256)
    path.write_bytes(bytes(data))


def _delete_params(step_dir: Path) -> None:
    import shutil

    shutil.rmtree(step_dir / "params")


def _delete_meta(step_dir: Path) -> None:
    for p in (step_dir / "meta").rglob("*"):
        if p.is_file():
            p.unlink()


def _tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("damage", [_truncate, _bit_rot, _delete_params, _delete_meta])
def test_damaged_latest_step_falls_back_to_the_one_before(tmp_path, damage):
    held = _saved(tmp_path / "checkpoints")
    damage(tmp_path / "checkpoints" / "4")
    lines = []
    like = ({k: jnp.zeros_like(v) for k, v in PARAMS.items()}, optax.adam(1e-2).init(PARAMS))
    with Checkpointer(tmp_path / "checkpoints") as ckpt:
        step, params, _, meta = ckpt.restore_latest(*like, log=lines.append)
        assert (step, meta) == (2, {"step": 2})
        for k in PARAMS:
            np.testing.assert_array_equal(np.asarray(params[k]), np.asarray(held[2][k]))
        assert ckpt.all_steps() == [2]
        ckpt.save(4, params, like[1], {"step": 4})  # the number is free again
        ckpt.wait()
        assert ckpt.all_steps() == [2, 4]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert lines[0].startswith(f"checkpoint of step 4 in {tmp_path / 'checkpoints'} does not "
                               "restore (")
    assert lines[1] == (f"moved the damaged checkpoint of step 4 to "
                        f"{tmp_path / 'checkpoints.unrestorable' / '4'}")
    assert (tmp_path / "checkpoints.unrestorable" / "4").is_dir()


def test_no_step_restores_is_one_line_and_nothing_is_deleted(tmp_path):
    _saved(tmp_path / "checkpoints")
    for step in (2, 4):
        _truncate(tmp_path / "checkpoints" / str(step))
    before = _tree(tmp_path)
    like = ({k: jnp.zeros_like(v) for k, v in PARAMS.items()}, optax.adam(1e-2).init(PARAMS))
    with Checkpointer(tmp_path / "checkpoints") as ckpt, \
            pytest.raises(NoCheckpointRestores) as err:
        ckpt.restore_latest(*like, log=lambda _: None)
    text = str(err.value)
    assert "\n" not in text and "step 4: " in text and "step 2: " in text
    assert text.endswith("nothing was deleted")
    assert _tree(tmp_path) == before


def test_nothing_saved_starts_fresh(tmp_path):
    like = (PARAMS, optax.adam(1e-2).init(PARAMS))
    with Checkpointer(tmp_path / "checkpoints") as ckpt:
        step, params, _, meta = ckpt.restore_latest(*like, log=lambda _: None)
    assert (step, meta) == (0, {}) and params is PARAMS


def test_abandoned_orbax_read_tasks_log_nothing_after_a_failed_restore(caplog):
    """A failed restore leaves Orbax's reads of the damaged files as asyncio tasks whose
    exception nobody retrieves; collected, asyncio logs each with a traceback ('Task exception
    was never retrieved'). After `_quiet_abandoned_reads` those of Orbax's code log nothing;
    any other task's exception still does."""
    code = {}
    exec(compile("async def read_shard():\n    raise ValueError('truncated shard')\n",
                 "/site-packages/orbax/checkpoint/_src/fake_serialization.py", "exec"), code)

    async def not_orbax():
        raise ValueError("someone else's bug")

    def abandon(make):
        loop = asyncio.new_event_loop()
        task = loop.create_task(make())
        loop.run_until_complete(asyncio.wait([task]))  # done, its exception not retrieved
        loop.close()
        del task
        gc.collect()

    _quiet_abandoned_reads()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        abandon(code["read_shard"])
        assert not [r for r in caplog.records if r.name == "asyncio"]
        abandon(not_orbax)
    reports = [r for r in caplog.records if r.name == "asyncio"]
    assert len(reports) == 1 and "never retrieved" in reports[0].getMessage()
    assert "someone else's bug" in str(reports[0].exc_info[1])


def test_late_read_reports_are_quieted_before_the_first_restore_of_several(tmp_path,
                                                                           monkeypatch):
    """A damaged read's callbacks may report from Orbax's threads while the restore is still
    failing: with an older step to fall back to, the filters are in place before the first
    restore is tried (not only after it failed)."""
    import sys
    import threading

    _saved(tmp_path)
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)
    seen = []
    original = Checkpointer.restore

    def restore(self, *args):
        seen.append(getattr(sys.unraisablehook, "locojax_quiet_reads", False))
        return original(self, *args)

    monkeypatch.setattr(Checkpointer, "restore", restore)
    opt = optax.adam(1e-2).init(PARAMS)
    with Checkpointer(tmp_path, keep=2) as ckpt:
        step, _, _, _ = ckpt.restore_latest(PARAMS, opt, log=lambda _: None)
    assert step == 4 and seen == [True]

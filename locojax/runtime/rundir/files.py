"""What a run directory holds: the names every writer and reader of a run uses.

    plan.json        the compiled plan the hosts ran (written first)
    resolved_config.json  the configuration of the first launch (`runtime.preflight`)
    metrics.jsonl    one JSON row per step (`runtime.metrics`)
    tb/              the same scalars for TensorBoard
    checkpoints/     Orbax checkpoints, one directory per step
    rewards.png      the run's plot (`runtime.plots.plot_run`)
    reference/       the frozen KL reference policy, saved once (`runtime.trainer`)
    hf/              the final policy as a Hugging Face model directory (`runtime.rundir.export`),
                     written as `.hf.partial-<pid>/` and swapped in whole with its marker
                     `locojax_export.json` ({"step": n}) written last (`publish_export`)
    provenance.json  where the first launch's weights, dtypes and data came from
                     (`runtime.rundir.provenance`)
    ray/             Ray's temp directory of a DA run, when the path is short enough
    .locojax.lock    held (flock and a lease) by the run using the directory: its pid, host,
                     token and heartbeat
                     (`runtime.rundir.owner`)

`LAYOUT` says which of these is a file and which a directory: a run checks each one there
before it starts (`owner.check_layout`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from compiler import ExecutionPlan, plan_from_json, plan_to_json
from locojax.runtime.errors import RunDirError

PLAN_FILE = "plan.json"
RECORD_FILE = "resolved_config.json"
METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
CHECKPOINTS_DIR = "checkpoints"
REWARDS_PLOT = "rewards.png"
REFERENCE_DIR = "reference"
HF_DIR = "hf"
RAY_DIR = "ray"
PROVENANCE_FILE = "provenance.json"
LOCK_FILE = ".locojax.lock"
UNRESTORABLE_DIR = f"{CHECKPOINTS_DIR}.unrestorable"
EXPORT_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                "model.safetensors", "config.json")
"""What a whole HF export holds, in the order it is written (config.json last)."""
EXPORT_MARKER = "locojax_export.json"
"""Written last into a finished export: {"step": the newest checkpoint's step then}. An
export without it, or of another step, is not the run's final one (`export_complete`)."""
LAYOUT: dict[str, bool] = {
    PLAN_FILE: False, RECORD_FILE: False, METRICS_FILE: False, TB_DIR: True,
    CHECKPOINTS_DIR: True, UNRESTORABLE_DIR: True, REWARDS_PLOT: False, REFERENCE_DIR: True,
    HF_DIR: True, RAY_DIR: True, PROVENANCE_FILE: False, LOCK_FILE: False,
    **{f"{HF_DIR}/{name}": False for name in (*EXPORT_FILES, EXPORT_MARKER)},
}
"""{path in the run directory: whether it is a directory} of every name the run reads or
writes there."""
PROBE_PREFIX = ".write-probe-"
"""A run's preflight writes and removes `<PROBE_PREFIX><pid>` to see that the directory is
writable; another host of the same run may see it for a moment."""
MARKERS = (LOCK_FILE, PLAN_FILE, RECORD_FILE)
"""Names only a LoCoJAX run writes, the first ones it writes: a directory holding one is a
run directory."""


def step_of(name: str) -> int | None:
    """The step a checkpoint directory's name stands for: ASCII digits only (`²` and `٣` are
    digits to `str.isdigit`, not steps), else None."""
    return int(name) if name.isascii() and name.isdigit() else None


def export_complete(export_dir: Path, step: int | None = None) -> bool:
    """Whether `export_dir` holds a whole HF export that `publish_export` finished (its
    marker), of checkpoint step `step` when given: an export left by an earlier, shorter run
    of the same directory is not complete for a later step."""
    return export_problem(export_dir, step) is None


def export_problem(export_dir: Path, step: int | None = None) -> str | None:
    """Why `export_dir` is not a whole export of `step` (`export_complete`), in words; None
    when it is one."""
    marker = export_dir / EXPORT_MARKER
    try:
        done = json.loads(marker.read_bytes())
    except FileNotFoundError:
        return f"{marker}: missing"
    except (OSError, ValueError) as err:
        return f"{marker}: not JSON ({type(err).__name__})"
    if not isinstance(done, dict) or not isinstance(done.get("step"), int):
        return f"{marker}: holds {json.dumps(done)[:40]}, not {{\"step\": <n>}}"
    if step is not None and done["step"] != step:
        return f"{marker}: the export of step {done['step']}, not {step}"
    missing = [name for name in EXPORT_FILES if not (export_dir / name).is_file()]
    return f"{export_dir}: no {missing[0]}" if missing else None


def export_staging(export_dir: Path) -> Path:
    """A new, empty directory beside `export_dir` to write an export into (earlier exports'
    leftovers, killed mid-write, removed first)."""
    for stale in export_dir.parent.glob(f".{export_dir.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = export_dir.with_name(f".{export_dir.name}.partial-{os.getpid()}")
    staging.mkdir(parents=True)
    return staging


def publish_export(staging: Path, export_dir: Path, step: int) -> Path:
    """Mark the export written in `staging` as step `step`'s and put it at `export_dir` in
    place of any earlier one. Killed at any point, `export_dir` is the earlier export (whose
    marker names its own step), absent, or this one: never a mix. An `export_dir` that was a
    symbolic link is replaced, the link removed and its target left as it was."""
    (staging / EXPORT_MARKER).write_text(json.dumps({"step": step}) + "\n")
    old = export_dir.with_name(f".{export_dir.name}.old-{os.getpid()}")
    linked = export_dir.is_symlink()
    if linked or export_dir.exists():
        export_dir.rename(old)
    staging.rename(export_dir)
    if linked:  # rmtree refuses a link (and ignore_errors would have left it behind)
        old.unlink()
    else:
        shutil.rmtree(old, ignore_errors=True)
    return export_dir


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` by a file holding `text`, whole or not at all: written under a temp
    name of this process's own beside it (created anew with O_EXCL, never through a link),
    flushed to disk, renamed over `path` (a link there is replaced, not followed), and the
    directory's entry synced. A killed writer leaves the old file or the new one."""
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_plan(plan: ExecutionPlan, run_dir: Path) -> Path:
    """Write `plan` as the run directory's plan.json (creating the directory), atomically
    (`write_atomic`): a killed launch leaves the old plan.json or the new one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / PLAN_FILE
    write_atomic(path, plan_to_json(plan))
    return path


def load_plan(run_dir: Path) -> ExecutionPlan:
    """The plan a run directory holds; RunDirError (one line naming the file) when plan.json
    cannot be read or is not a plan LoCoJAX wrote."""
    path = Path(run_dir) / PLAN_FILE
    try:
        return plan_from_json(path.read_text())
    except OSError as err:
        raise RunDirError(f"{path}: cannot be read ({err.strerror or err})") from err
    except (ValueError, TypeError) as err:  # what plan_from_json raises for data not a plan
        raise RunDirError(f"{path}: not a plan LoCoJAX wrote ({err}); the run writes it at "
                          "launch: restore it, or use another run directory") from err

"""What a run directory holds: the names every writer and reader of a run uses.

    plan.json        the compiled plan the hosts ran (written first)
    resolved_config.json  the configuration of the first launch (`runtime.preflight`)
    metrics.jsonl    one JSON row per step (`runtime.metrics`)
    tb/              the same scalars for TensorBoard
    checkpoints/     Orbax checkpoints, one directory per step
    rewards.png      the run's plot (`runtime.plots.plot_run`)
    reference/       the frozen KL reference policy, saved once (`runtime.trainer`)
    hf/              the final policy as a Hugging Face model directory (`runtime.rundir.export`)
    provenance.json  where the first launch's weights, dtypes and data came from
                     (`runtime.rundir.provenance`)
    ray/             Ray's temp directory of a DA run, when the path is short enough
    .locojax.lock    held (flock) by the run using the directory: its pid and host
                     (`runtime.rundir.owner`)

`LAYOUT` says which of these is a file and which a directory: a run checks each one there
before it starts (`owner.check_layout`).
"""

from __future__ import annotations

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
LAYOUT: dict[str, bool] = {
    PLAN_FILE: False, RECORD_FILE: False, METRICS_FILE: False, TB_DIR: True,
    CHECKPOINTS_DIR: True, UNRESTORABLE_DIR: True, REWARDS_PLOT: False, REFERENCE_DIR: True,
    HF_DIR: True, RAY_DIR: True, PROVENANCE_FILE: False, LOCK_FILE: False,
    **{f"{HF_DIR}/{name}": False for name in EXPORT_FILES},
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


def export_complete(export_dir: Path) -> bool:
    """Whether `export_dir` holds a whole HF export."""
    return all((export_dir / name).is_file() for name in EXPORT_FILES)


def write_plan(plan: ExecutionPlan, run_dir: Path) -> Path:
    """Write `plan` as the run directory's plan.json (creating the directory), atomically: a
    killed launch leaves the old plan.json or the new one, never a torn file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / PLAN_FILE
    partial = run_dir / f".{PLAN_FILE}.partial"
    partial.write_text(plan_to_json(plan))
    partial.replace(path)
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

"""What is checked before a run does any work: its directory, and what that directory holds.

    check_run_dir   a writable directory with room for one checkpoint and the HF export, by
                    the plan's estimate: the training state (`train_state_bytes_per_param` per
                    parameter: parameters and AdamW moments, and their gradients besides) plus
                    the exported parameters (`RunDirError`). Orbax keeps two checkpoints; only
                    one must fit at the start, and a later ENOSPC is reported in one line too
                    (`disk_full` finds it behind Orbax's wrappers).
    check_resume    the first launch in a directory records the resolved configuration
                    (`RECORD_FILE`: the plan's model, workload, algorithm, sampling and run sections
                    as dotted keys, and the sha256 of each reward function's file); a later launch there is refused (`ResumeRefused`) when a
                    recorded key other than those in `MAY_CHANGE` differs (parameter shapes,
                    optimizer, data, seed, ...), or when the directory already holds a
                    checkpoint past `run.steps`.

Both run before anything is written, so a refused run leaves plan.json and the record as
they were.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Any

from compiler import ExecutionPlan, from_data, to_data
from locojax.rewards.python_fns import fn_digest
from locojax.runtime.errors import ResumeRefused, RunDirError
from locojax.runtime.rundir.files import CHECKPOINTS_DIR, PLAN_FILE, RECORD_FILE


def checkpoint_bytes(plan: ExecutionPlan) -> int:
    """Bytes of one checkpoint and the HF export, by the plan's estimates."""
    state = plan.model.param_count * plan.sharding.train_state_bytes_per_param
    return int(state + plan.model.param_bytes)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


def check_run_dir(run_dir: Path, need_bytes: int) -> None:
    """Create `run_dir` if needed; `RunDirError` unless it is a writable directory with
    `need_bytes` free."""
    where = f"hydra.run.dir={run_dir}"
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{where}: not a directory")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunDirError(f"{where}: cannot create it ({err.strerror})") from err
    if not run_dir.is_dir():
        raise RunDirError(f"{where}: not a directory")
    probe = run_dir / f".write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as err:
        raise RunDirError(f"{where}: not writable ({err.strerror})") from err
    free = shutil.disk_usage(run_dir).free
    if free < need_bytes:
        raise RunDirError(f"{where}: {_gib(free)} free, one checkpoint and the HF export need "
                          f"about {_gib(need_bytes)} (the plan's estimate)")


def disk_full(err: BaseException) -> OSError | None:
    """The ENOSPC / EDQUOT error behind `err` (Orbax wraps its writers' errors), or None."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return err
        err = err.__cause__ or err.__context__
    return None


MAY_CHANGE = (
    "run.steps",
    "run.checkpoint_every",
    "run.eval_every",
    "run.plan_only",
    "run.eval_samples",
    "run.loggers",
    "run.wandb.project",
    "run.wandb.name",
    "run.wandb.tags",
    "run.wandb.mode",
    "run.mlflow.tracking_uri",
    "run.mlflow.experiment",
    "run.mlflow.run_name",
    "model.name",
    "model.source",
    "model.checkpoint",
    "model.export_dtype",
    "workload.eval_prompts",
    "workload.reward_timeout_s",
    "sampling.slots",
    "sampling.schedule",
    "sampling.cpu_kernels",
    "algorithm.remat",
)
"""Keys a resumed run may change: length and bookkeeping, labels, where initial weights came
from (used only before the first checkpoint), and settings that change speed or memory, not
the numbers. Machine, placement and controller are not recorded: a run may resume on another
mesh (Orbax restores onto the new shardings)."""
SHOWN = 6
"""Differences named in the refusal line; the rest are counted."""


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: data}


def record_of(plan: ExecutionPlan) -> dict[str, Any]:
    """{dotted key: value} of the configuration the plan was compiled from (the recorded part)."""
    sections = {"model": plan.model.config, "workload": plan.workload,
                "algorithm": plan.algorithm, "sampling": plan.sampling, "run": plan.run}
    # A reward function's code is part of what was trained on: its file's hash is recorded.
    digests = {f"workload.reward_fn_sha256.{name}": fn_digest(spec)
               for name, spec in plan.workload.reward_fns.items()}
    return _flat(to_data(sections)) | digests


def _recorded(run_dir: Path) -> dict[str, Any] | None:
    """The record of an earlier launch: its own file, else an older run's plan.json."""
    for name, read in ((RECORD_FILE, lambda d: d),
                       (PLAN_FILE, lambda d: record_of(from_data(ExecutionPlan, d)))):
        path = run_dir / name
        if path.is_file():
            try:
                return read(json.loads(path.read_text()))
            except (ValueError, TypeError, KeyError) as err:
                raise ResumeRefused(f"{path}: unreadable ({err}); it records what this run "
                                    "directory was made with, use a new hydra.run.dir") from err
    return None


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Fully written checkpoint steps (Orbax's unfinished saves carry a tmp suffix)."""
    root = run_dir / CHECKPOINTS_DIR
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Recorded keys that differ (a key only one side knows came with another code version)."""
    keys = [k for k in sorted(set(old) & set(new)) if k not in MAY_CHANGE and old[k] != new[k]]
    return [f"{k}={old[k]!r} there, {new[k]!r} now" for k in keys]


def check_resume(plan: ExecutionPlan, run_dir: Path) -> None:
    """Raise `ResumeRefused` when `plan` may not continue what `run_dir` holds."""
    old = _recorded(run_dir)
    if old is not None:
        changes = _changes(old, record_of(plan))
        if changes:
            more = f" (and {len(changes) - SHOWN} more)" if len(changes) > SHOWN else ""
            raise ResumeRefused(
                f"{run_dir} was made with another configuration: {'; '.join(changes[:SHOWN])}"
                f"{more}. On resume only {', '.join(MAY_CHANGE[:4])} and settings of speed "
                "may change; use a new hydra.run.dir for a new run")
    steps = checkpoint_steps(run_dir)
    if steps and steps[-1] > plan.run.steps:
        raise ResumeRefused(f"run.steps={plan.run.steps}: {run_dir} already holds the checkpoint "
                            f"of step {steps[-1]}; run.steps may only grow on resume")


def record(plan: ExecutionPlan, run_dir: Path) -> None:
    """Write the record on the first launch in `run_dir` (kept as it is afterwards)."""
    path = run_dir / RECORD_FILE
    if not path.exists():
        partial = run_dir / f".{RECORD_FILE}.partial"
        partial.write_text(json.dumps(record_of(plan), indent=1) + "\n")
        partial.replace(path)

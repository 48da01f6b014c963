"""Summary of a `python -m locojax -m ...` sweep of real runs: measured vs predicted step time.

A Hydra callback: after each job it reads the job's `plan.json` and `metrics.jsonl`; when the
sweep ends it writes `runs.csv` and `runs.png` (median measured step time per job, steps after
the first, next to the plan's predicted step time for the mode the job ran) in the sweep
directory and prints the table.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode

from locojax.reports.plan_sweep import swept, write_csv
from locojax.runtime.observe.metrics import read_metrics
from locojax.runtime.observe.plots import plot_sweep
from locojax.runtime.rundir.files import METRICS_FILE, PLAN_FILE, load_plan


def run_row(run_dir: Path) -> dict[str, Any] | None:
    """Measured and predicted step time of one finished run (None without metrics)."""
    metrics = run_dir / METRICS_FILE
    if not (metrics.exists() and (run_dir / PLAN_FILE).exists()):
        return None
    rows, plan = read_metrics(metrics), load_plan(run_dir)
    steady = rows[1:] or rows
    if not steady:
        return None
    return {
        "run_dir": str(run_dir),
        "mode": plan.cost_mode,
        "hosts": plan.topology.hosts,
        "rollout_hosts": len(plan.partitions.rollout_hosts),
        "trainer_hosts": len(plan.partitions.trainer_hosts),
        "rollout_fraction": plan.placement.rollout_fraction,
        "measured_step_s": statistics.median(r["step_s"] for r in steady),
        "predicted_step_s": plan.own_cost.step_s,
        "final_reward": statistics.fmean(r["reward_mean"] for r in rows[-10:]),
        "steps": len(rows),
    }


class RunSweepSummary(Callback):
    """Collects each job's `run_row`, rewriting runs.csv after each job (a sweep that a
    failed job ends keeps the jobs that ran); runs.png and the lines when the sweep ends."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        # A single run (no -m) is no sweep: nothing to tabulate.
        if config.hydra.mode != RunMode.MULTIRUN or job_return.status != JobStatus.COMPLETED:
            return
        row = run_row(Path(config.hydra.runtime.output_dir))
        if row is not None:
            row["overrides"] = " ".join(config.hydra.overrides.task)
            self.rows.append(row)
            write_csv(self.rows, Path(config.hydra.sweep.dir) / "runs.csv")

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if not self.rows:
            return
        out = Path(config.hydra.sweep.dir)
        # The x axis is what the sweep varied (run.seed, placement.rollout_fraction, ...).
        key, values, labels = swept(self.rows)
        rows = [{**row, key: value} for row, value in zip(self.rows, values or labels,
                                                          strict=True)]
        plot_sweep(rows, key, "measured_step_s", "predicted_step_s", out / "runs.png",
                   labels=None if values else labels)
        for row in self.rows:
            print(f"{row['overrides']}: measured {row['measured_step_s']:.3f} s/step, "
                  f"predicted {row['predicted_step_s']:.3f}, final reward "
                  f"{row['final_reward']:.3f}")
        print(f"wrote {out / 'runs.csv'} and {out / 'runs.png'}")

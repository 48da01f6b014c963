"""Calibration report: fit a hardware entry to measured runs, print and write it.

Reads each run's `plan.json` and `metrics.jsonl`, fits the cost constants of its hardware
entry (`compiler.cost.fit`), prints predicted vs measured seconds per phase before and
after, and writes `<out>/hardware/<name>.yaml` (the plan's hardware with the fitted `cost:`
block) outside the source tree: in the run directory by default, read through Hydra's search
path (`usage`). Runs given as checks get the same table under the fitted constants.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from compiler.config import CostConstants, HardwareSpec
from compiler.cost.fit import (
    MEASURED_KEYS,
    calibrated_hardware,
    comparison_table,
    fit_runs,
    measured_phases,
    predicted_phases,
    summary,
)
from compiler.plan import ExecutionPlan
from locojax.runtime.errors import UserError
from locojax.runtime.observe.metrics import read_metrics
from locojax.runtime.rundir.files import METRICS_FILE, PLAN_FILE, load_plan

CALIBRATION_DIR = "calibration"
"""The default `--out` below the first run directory: `<run dir>/calibration/hardware/`."""


def load_run(run_dir: Path) -> tuple[ExecutionPlan, list[dict]]:
    """The plan and the metrics rows of a run directory; `UserError` naming the file that is
    missing or unreadable."""
    try:
        plan = load_plan(run_dir)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise UserError(f"{run_dir / PLAN_FILE}: {_why(err)}") from err
    path = run_dir / METRICS_FILE
    try:
        rows = read_metrics(path)
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: {_why(err)}") from err
    if not rows:
        raise UserError(f"{path}: no metric rows to fit")
    _check_numbers(path, rows)
    return plan, rows


def _check_numbers(path: Path, rows: list[dict]) -> None:
    """`UserError` naming the first row and key whose value is not a finite number, among the
    keys the fit reads (a row the run wrote holds numbers there, or no key)."""
    keys = [k for phase in MEASURED_KEYS.values() for k in phase] + ["host_dispatches"]
    for number, row in enumerate(rows, start=1):
        for key in keys:
            value = row.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not math.isfinite(value):
                raise UserError(f"{path}: row {number} (step {row.get('step', '?')}): {key} is "
                                f"{json.dumps(value)[:40]}, not a number of seconds; the fit "
                                "reads the rows a run wrote")


def _why(err: Exception) -> str:
    if isinstance(err, OSError):
        return err.strerror or str(err)
    return f"not a plan or metrics file ({' '.join(str(err).split())[:160]})"


def _scalar(value: object) -> str:
    """A YAML scalar: strings double-quoted (JSON escapes are valid YAML), floats with a dot."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        text = repr(value)
        mantissa, _, exp = text.partition("e")
        # PyYAML (YAML 1.1) reads 1e-05 as a string: give the mantissa a dot.
        return f"{mantissa}.0e{exp}" if exp and "." not in mantissa else text
    return str(value)


def hardware_yaml(hw: HardwareSpec) -> str:
    """A `conf/hardware/<name>.yaml` entry in the layout of the committed ones."""
    out = [f"# {hw.name}: accelerator facts per chip, cost constants fitted by locojax.calibrate."]
    out += [f"{f.name}: {_scalar(getattr(hw, f.name))}" for f in fields(hw) if f.name != "cost"]
    out.append("cost:")
    for f in fields(CostConstants):
        value = getattr(hw.cost, f.name)
        # Four significant figures: the fit is no better than the run's noise.
        out.append(f"  {f.name}: {_scalar(float(f'{value:.4g}') if isinstance(value, float) else value)}")
    return "\n".join(out) + "\n"


def _print_run(what: str, run_dir: Path, plan: ExecutionPlan) -> None:
    topo = plan.topology
    print(f"\n{what} {run_dir}: model {plan.model.config.name} ({plan.model.param_count:,} "
          f"params), {topo.hosts} host(s) x {topo.devices_per_host} device(s), {topo.accelerator}")


def usage(out: Path, name: str) -> str:
    """How to use an entry written to `out`/hardware/`name`.yaml: the search path that finds
    it, on any entry point's command line."""
    return (f"use it: locojax-plan <your overrides> hardware={name} "
            f"'hydra.searchpath=[file://{out.absolute()}]' (the same two overrides work for "
            f"locojax; or copy the file into conf/hardware/ of a checkout)")


def calibrate(run_dirs: Sequence[Path], name: str | None, checks: Sequence[Path], skip: int,
              out: Path, dry_run: bool) -> Path | None:
    """Fit one entry to `run_dirs`, print the tables, write the entry; returns its path."""
    runs = [(plan, measured_phases(rows, skip), rows) for plan, rows in map(load_run, run_dirs)]
    hw = runs[0][0].topology.hardware
    fitted, notes = fit_runs([(plan, m) for plan, m, _ in runs], hw.cost)
    name = name or f"{hw.name}_calibrated"
    steps = sum(max(len(rows) - skip, 1) for *_, rows in runs)
    source = (f"calibrated from {', '.join(map(str, run_dirs))} on "
              f"{datetime.date.today().isoformat()}: medians of {steps} steps, {summary(fitted)}")
    for run_dir, (plan, measured, _) in zip(run_dirs, runs, strict=True):
        _print_run("fit on", run_dir, plan)
        print(comparison_table([(plan.topology.hardware.name, predicted_phases(plan)),
                                (name, predicted_phases(plan, fitted))], measured))
    for note in notes:
        print(f"note: {note}")
    print("fitted: " + summary(fitted))
    for other in checks:
        plan, rows = load_run(other)
        _print_run("check", other, plan)
        print(comparison_table([(plan.topology.hardware.name, predicted_phases(plan)),
                                (name, predicted_phases(plan, fitted))],
                               measured_phases(rows, skip)))
    if dry_run:
        return None
    path = out / "hardware" / f"{name}.yaml"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(hardware_yaml(calibrated_hardware(hw, fitted, name, source)))
    except OSError as err:
        raise UserError(f"{path}: cannot write the entry ({err.strerror or err}); pass --out "
                        "<a writable directory>") from err
    print(f"wrote {path}")
    print(usage(out, name))
    return path

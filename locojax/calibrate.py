"""`python -m locojax.calibrate <run dir> [name=<entry>]`: fit a hardware entry to a run.

    python -m locojax.calibrate outputs/2026-11-29/12-00-00            # -> cpu_calibrated
    python -m locojax.calibrate /tmp/cal1 name=cpu_laptop --check /tmp/cal2 --check /tmp/cal3

Reads the run's `plan.json` and `metrics.jsonl`, fits the cost constants of its hardware entry
(`compiler.calibration`), writes `<conf dir>/hardware/<name>.yaml` (the plan's hardware with
the fitted `cost:` block) and prints predicted vs measured seconds per phase before and after.
`--check` prints the same table for other runs under the fitted constants (cross-validation).
"""

from __future__ import annotations

import argparse
import datetime
import json
from dataclasses import fields
from pathlib import Path

from compiler import plan_from_json
from compiler.calibration import (
    calibrated_hardware,
    comparison_table,
    fit_runs,
    measured_phases,
    predicted_phases,
    summary,
)
from compiler.config import CostConstants, HardwareSpec
from compiler.plan import ExecutionPlan

DEFAULT_CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def load_run(run_dir: Path) -> tuple[ExecutionPlan, list[dict]]:
    """The plan and the metrics rows of a run directory."""
    plan = plan_from_json((run_dir / "plan.json").read_text())
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return plan, [json.loads(line) for line in lines if line.strip()]


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


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m locojax.calibrate", description=__doc__.split(
        "\n")[0])
    p.add_argument("items", nargs="+", metavar="<run dir> ... [name=<entry>]",
                   help="run directories with plan.json and metrics.jsonl (several: one fit "
                        "for all); name= the hardware entry (default <hardware>_calibrated)")
    p.add_argument("--conf-dir", type=Path, default=DEFAULT_CONF_DIR,
                   help="config root; the entry goes to <conf dir>/hardware/")
    p.add_argument("--check", type=Path, action="append", default=[],
                   help="another run dir to predict with the fitted constants (repeatable)")
    p.add_argument("--skip", type=int, default=1, help="first steps left out (compilation)")
    p.add_argument("--dry-run", action="store_true", help="print, do not write the entry")
    args = p.parse_args(argv)
    args.name, args.run_dirs = None, []
    for item in args.items:
        key, sep, value = item.partition("=")
        if not sep:
            args.run_dirs.append(Path(item))
        elif key != "name" or not value:
            p.error(f"unknown override {item!r}: only name=<entry>")
        else:
            args.name = value
    if not args.run_dirs:
        p.error("no run directory")
    return args


def _print_run(what: str, run_dir: Path, plan: ExecutionPlan) -> None:
    topo = plan.topology
    print(f"\n{what} {run_dir}: model {plan.model.config.name} ({plan.model.param_count:,} "
          f"params), {topo.hosts} host(s) x {topo.devices_per_host} device(s), {topo.accelerator}")


def main(argv: list[str] | None = None) -> Path | None:
    """Fit, write the entry, print the tables; returns the written path."""
    args = _args(argv)
    runs = [(plan, measured_phases(rows, args.skip), rows)
            for plan, rows in map(load_run, args.run_dirs)]
    hw = runs[0][0].topology.hardware
    fitted, notes = fit_runs([(plan, m) for plan, m, _ in runs], hw.cost)
    name = args.name or f"{hw.name}_calibrated"
    steps = sum(max(len(rows) - args.skip, 1) for *_, rows in runs)
    source = (f"calibrated from {', '.join(map(str, args.run_dirs))} on "
              f"{datetime.date.today().isoformat()}: medians of {steps} steps, {summary(fitted)}")
    for run_dir, (plan, measured, _) in zip(args.run_dirs, runs, strict=True):
        _print_run("fit on", run_dir, plan)
        print(comparison_table([(plan.topology.hardware.name, predicted_phases(plan)),
                                (name, predicted_phases(plan, fitted))], measured))
    for note in notes:
        print(f"note: {note}")
    print("fitted: " + summary(fitted))
    for other in args.check:
        plan, rows = load_run(other)
        _print_run("check", other, plan)
        print(comparison_table([(plan.topology.hardware.name, predicted_phases(plan)),
                                (name, predicted_phases(plan, fitted))],
                               measured_phases(rows, args.skip)))
    if args.dry_run:
        return None
    path = args.conf_dir / "hardware" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(hardware_yaml(calibrated_hardware(hw, fitted, name, source)))
    print(f"wrote {path} (use hardware={name})")
    return path


if __name__ == "__main__":
    main()

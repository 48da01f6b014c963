"""`python -m locojax.calibrate <run dir> [name=<entry>]`: fit a hardware entry to a run.

    python -m locojax.calibrate outputs/2026-11-29/12-00-00            # -> cpu_calibrated
    python -m locojax.calibrate /tmp/cal1 name=cpu_laptop --check /tmp/cal2 --check /tmp/cal3

Reads the run's `plan.json` and `metrics.jsonl`, fits the cost constants of its hardware entry
(`compiler.cost.fit`), writes `<out>/hardware/<name>.yaml` (the plan's hardware with the
fitted `cost:` block; `<out>` defaults to `<first run dir>/calibration`, never the package's
own `conf/`) and prints predicted vs measured seconds per phase before and after, then the
command line that uses the entry (`hardware=<name> 'hydra.searchpath=[file://<out>]'`).
`--check` prints the same table for other runs under the fitted constants
(cross-validation). The work is `locojax.reports.calibration.calibrate`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from locojax.launch.door import door
from locojax.reports.calibration import CALIBRATION_DIR, calibrate


class _Parser(argparse.ArgumentParser):
    """argparse with its mistakes on one line (the usage stays behind --help)."""

    def error(self, message: str):
        print(f"error: {message} (see python -m locojax.calibrate --help)", file=sys.stderr)
        sys.exit(2)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="python -m locojax.calibrate", description=__doc__.split(
        "\n")[0])
    p.add_argument("items", nargs="+", metavar="<run dir> ... [name=<entry>]",
                   help="run directories with plan.json and metrics.jsonl (several: one fit "
                        "for all); name= the hardware entry (default <hardware>_calibrated)")
    p.add_argument("--out", type=Path, default=None,
                   help="where the entry goes: <out>/hardware/<name>.yaml (default: "
                        "<first run dir>/calibration); pass it to hydra.searchpath")
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


def main(argv: list[str] | None = None) -> None:
    """Fit, write the entry, print the tables."""
    args = _args(argv)
    out = args.out if args.out is not None else args.run_dirs[0] / CALIBRATION_DIR
    calibrate(args.run_dirs, args.name, args.check, args.skip, out, args.dry_run)


def cli() -> None:
    """The `locojax-calibrate` command (`[project.scripts]`): `main` behind the door."""
    door(main, hydra_app=False)


if __name__ == "__main__":
    cli()

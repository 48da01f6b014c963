"""Summary of a `python -m locojax.plan -m ...` sweep: one CSV row per plan, a table and a plot.

Each job of the sweep returns a flat row (`plan_row`); this Hydra callback collects them and,
when the sweep ends, writes `plans.csv` and `plans.png` into the sweep directory and prints the
table. Jobs are labelled by the overrides that vary across the sweep (`model=qwen3_8b`). The
table and the plot's upper panel show the compute / host / network / transfer shares of each
plan's own mode (or of the mode named by `hydra.callbacks.plan_summary.mode=co|da|single`);
the table adds every mode's step time, `speedup` (single / CO) and `da_speedup` (CO / DA), and
the plot's lower panel the step time of each mode.

Commands (run from the repository root; `mesh.chips=0` picks the smallest machine that fits):

    # where the single controller's step goes, per model size
    python -m locojax.plan -m +experiment=gsm8k_co controller=single mesh=v7x mesh.chips=0 \
        model=qwen3_0_6b,qwen3_1_7b,qwen3_4b,qwen3_8b,qwen3_14b,qwen3_32b,llama3_70b,llama3_405b
    # CO vs the single controller (every plan carries both), per workload and machine size
    python -m locojax.plan -m +experiment=gsm8k_co mesh=v7x mesh.chips=8,16,32,64 \
        workload=gsm8k,numina_cot
    # DA vs CO on NuminaMath-CoT at 256 chips, per rollout fraction
    python -m locojax.plan -m +experiment=numina_da mesh=v7x mesh.chips=256 \
        placement.rollout_fraction=0.25,0.5,0.75
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from rich.table import Table

from compiler.plan import COST_MODES, ExecutionPlan
from locojax.runtime.errors import SweepFailed
from locojax.runtime.observe.plots import pyplot
from locojax.runtime.observe.progress import uncut_console

MODES = COST_MODES
PARTS = ("compute_s", "host_s", "network_s", "exposed_transfer_s")
SHARES = ("compute", "host", "network", "transfer")
TABLE_MIN_WIDTH = 200
"""Columns of the sweep table on a terminal; narrower ones would truncate the labels."""


def plan_row(plan: ExecutionPlan, overrides: list[str]) -> dict[str, Any]:
    """The numbers of one plan that a sweep table shows (a flat row: the CSV's columns)."""
    topo, parts = plan.topology, plan.partitions
    row: dict[str, Any] = {
        "overrides": " ".join(overrides),
        "model": plan.model.config.name,
        "chips": topo.chips,
        "chips_from": str(topo.chips_from),
        "hosts": topo.hosts,
        "placement": str(plan.placement.mode),
        "mode": plan.cost_mode,
        "rollout_hosts": len(parts.rollout_hosts),
        "trainer_hosts": len(parts.trainer_hosts),
    }
    for mode in MODES:
        cost = getattr(plan.cost, mode) if plan.cost is not None else None
        for key in ("step_s", *PARTS, "rollout_s", "train_s"):
            row[f"{mode}_{key}"] = getattr(cost, key, None)
        for key in SHARES:
            row[f"{mode}_{key}_share"] = getattr(cost, f"{key}_share", None)
        if cost is None or not cost.feasible:
            row[f"{mode}_step_s"] = None
    row["speedup"] = _ratio(row["single_step_s"], row["co_step_s"])
    row["da_speedup"] = _ratio(row["co_step_s"], row["da_step_s"])
    return row


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def _label_rows(rows: list[dict[str, Any]]) -> list[str]:
    """Each job's overrides minus those shared by every job; bare values if one key varies."""
    split = [row["overrides"].split() for row in rows]
    common = set.intersection(*(set(s) for s in split)) if split else set()
    varying = [[o for o in s if o not in common] for s in split]
    keys = {o.split("=", 1)[0] for v in varying for o in v}
    if len(keys) == 1:
        return [" ".join(o.split("=", 1)[-1] for o in v) or "(base)" for v in varying]
    return [" ".join(_short(o) for o in v) or "(base)" for v in varying]


def swept(rows: list[dict[str, Any]]) -> tuple[str, list[float] | None, list[str]]:
    """What a sweep varied, from each row's `overrides`: (the swept key, or the keys joined
    with ', '; its values when one key varies and every value is a number, else None; each
    row's label)."""
    split = [dict(o.split("=", 1) for o in row["overrides"].split() if "=" in o)
             for row in rows]
    keys = sorted({k for s in split for k in s if len({t.get(k) for t in split}) > 1})
    labels = _label_rows(rows)
    if len(keys) != 1:
        return ", ".join(keys) or "job", None, labels
    try:
        return keys[0], [float(s[keys[0]]) for s in split], labels
    except (KeyError, ValueError):
        return keys[0], None, labels


def _short(override: str) -> str:
    """`mesh.chips=8` -> `chips=8`."""
    key, _, value = override.partition("=")
    return f"{key.rsplit('.', 1)[-1]}={value}"


def _mode(row: dict[str, Any], mode: str) -> str:
    return row["mode"] if mode == "plan" else mode


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """All rows, columns in first-seen order."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def plot_breakdown(rows: list[dict[str, Any]], mode: str, path: Path) -> None:
    """Stacked shares of `mode`'s step per job (top) and each mode's step time (bottom)."""
    plt = pyplot()
    labels, x = _label_rows(rows), range(len(rows))
    fig, (top, low) = plt.subplots(2, 1, figsize=(max(7.0, 0.9 * len(rows) + 1.5), 7.5), sharex=True)
    bottom = [0.0] * len(rows)
    for part in SHARES:
        values = [100 * float(row.get(f"{_mode(row, mode)}_{part}_share") or 0.0)
                  for row in rows]
        top.bar(x, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    top.set_ylabel("share of step (%)" + ("" if mode == "plan" else f", {mode}"))
    top.set_ylim(0, 100)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)  # beside the bars
    width = 0.8 / len(MODES)
    for i, m in enumerate(MODES):
        values = [float(row.get(f"{m}_step_s") or 0.0) for row in rows]
        low.bar([j + (i - 1) * width for j in x], values, width=width, label=m)
    low.set_yscale("log")
    low.set_ylabel("predicted step time (s)")
    low.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    low.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=7)
    low.set_xlabel(swept(rows)[0])  # what the sweep varied
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def sweep_table(rows: list[dict[str, Any]], mode: str) -> Table:
    """One line per job: label, machine, shares of the shown mode, every mode's step time."""
    table = Table(title="plan sweep: predicted step time and its shares")
    cols = ("job", "mode", "chips", "hosts", "roll/train", "step s", *SHARES,
            "co s", "da s", "single s", "single/co", "co/da")
    for col in cols:
        table.add_column(col, no_wrap=True)
    for row, label in zip(rows, _label_rows(rows), strict=True):
        m = _mode(row, mode)
        table.add_row(
            label, m, str(row["chips"]) + ("*" if row.get("chips_from") == "memory_fit" else ""),
            str(row["hosts"]), f"{row['rollout_hosts']}/{row['trainer_hosts']}",
            _fmt(row.get(f"{m}_step_s"), "{:.3g}"),
            *(_fmt(row.get(f"{m}_{k}_share"), "{:.2%}") for k in SHARES),
            *(_fmt(row.get(f"{k}_step_s"), "{:.3g}") for k in MODES),
            _fmt(row.get("speedup"), "{:.2f}x"), _fmt(row.get("da_speedup"), "{:.2f}x"))
    if any(row.get("chips_from") == "memory_fit" for row in rows):
        table.caption = "* chips chosen by memory fit (mesh.chips=0)"
    return table


def print_table(rows: list[dict[str, Any]], mode: str) -> None:
    """Print `sweep_table` at least `TABLE_MIN_WIDTH` columns wide."""
    console = uncut_console(stderr=False)
    console.width = max(console.width, TABLE_MIN_WIDTH)
    console.print(sweep_table(rows, mode))


def _fmt(value: Any, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


class PlanSweepSummary(Callback):
    """Hydra callback: collect each job's plan row, rewriting `plans.csv` after each job (a
    sweep cut short keeps the jobs that ran); the PNG and the table at the end. A job that
    printed an error (its plan returned no row) makes the sweep exit 2 after the table."""

    def __init__(self, mode: str = "plan") -> None:
        self.mode = mode
        self.rows: list[dict[str, Any]] = []
        self.failed: list[str] = []

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:  # a single plan (no -m) is no sweep
            return
        if job_return.status == JobStatus.COMPLETED and isinstance(job_return.return_value, dict):
            self.rows.append(job_return.return_value)
            out = Path(config.hydra.sweep.dir)
            out.mkdir(parents=True, exist_ok=True)
            write_csv(self.rows, out / "plans.csv")
        else:
            self.failed.append(" ".join(config.hydra.overrides.task))

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        out = Path(config.hydra.sweep.dir)
        if self.rows:
            plot_breakdown(self.rows, self.mode, out / "plans.png")
            print_table(self.rows, self.mode)
            print(f"wrote {out / 'plans.csv'} and {out / 'plans.png'}")
        if self.failed:
            raise SweepFailed(f"{len(self.failed)} of {len(self.failed) + len(self.rows)} jobs "
                              f"of the sweep failed (their lines above: "
                              f"{'; '.join(self.failed)}); plans.csv holds the others")

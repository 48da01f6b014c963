"""Summary of a `python -m locojax.plan -m ...` sweep: one CSV row per plan, a table and a plot.

Each job of the sweep returns a flat row (`plan_row`); this Hydra callback collects them and,
when the sweep ends, writes `plans.csv` and `plans.png` (stacked compute / host / network /
transfer time per job, for each plan's own mode, or the mode named by
`hydra.callbacks.plan_summary.mode=co|da|single`) into the sweep directory and prints the table.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from rich.console import Console
from rich.table import Table

MODES = ("co", "da", "single")
PARTS = ("compute_s", "host_s", "network_s", "exposed_transfer_s")


def plan_row(plan: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """The numbers of one plan (its JSON dict) that a sweep table shows."""
    topo, parts = plan["topology"], plan["partitions"]
    row: dict[str, Any] = {
        "overrides": " ".join(overrides),
        "model": plan["model"]["config"]["name"],
        "chips": topo["chips"],
        "hosts": topo["hosts"],
        "placement": plan["placement"]["mode"],
        "mode": own_mode(plan),
        "rollout_hosts": len(parts["rollout_hosts"]),
        "trainer_hosts": len(parts["trainer_hosts"]),
    }
    for mode in MODES:
        cost = (plan.get("cost") or {}).get(mode) or {}
        for key in ("step_s", *PARTS, "rollout_s", "train_s"):
            row[f"{mode}_{key}"] = cost.get(key)
        for key in ("compute_share", "host_share", "network_share"):
            row[f"{mode}_{key}"] = cost.get(key)
    return row


def own_mode(plan: dict[str, Any]) -> str:
    """The cost-model mode a plan itself runs: `single`, `da` or `co`."""
    if plan["controller"]["kind"] == "single":
        return "single"
    return "da" if plan["placement"]["mode"] == "disaggregated" else "co"


def _label_rows(rows: list[dict[str, Any]]) -> list[str]:
    """Each job's overrides minus those shared by every job of the sweep."""
    split = [row["overrides"].split() for row in rows]
    common = set.intersection(*(set(s) for s in split)) if split else set()
    return [" ".join(o for o in s if o not in common) or "(base)" for s in split]


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
    """Stacked bars of the step-time parts of `mode`, one bar per job."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = _label_rows(rows)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows)), 4.5))
    bottom = [0.0] * len(rows)
    for part in PARTS:
        values = [float(row.get(f"{_mode(row, mode)}_{part}") or 0.0) for row in rows]
        ax.bar(range(len(rows)), values, bottom=bottom, label=part.removesuffix("_s"))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("predicted step time (s)" + ("" if mode == "plan" else f", {mode}"))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_table(rows: list[dict[str, Any]], mode: str) -> None:
    """One line per job: overrides, hosts, predicted step time and shares."""
    table = Table(title="plan sweep: predicted step time")
    for col in ("job", "mode", "hosts", "roll/train", "step s", "compute", "host", "network"):
        table.add_column(col)
    for row, label in zip(rows, _label_rows(rows), strict=True):
        m = _mode(row, mode)
        share = [row.get(f"{m}_{k}_share") for k in ("compute", "host", "network")]
        table.add_row(
            label,
            m,
            str(row["hosts"]),
            f"{row['rollout_hosts']}/{row['trainer_hosts']}",
            _fmt(row.get(f"{m}_step_s"), "{:.3g}"),
            *(_fmt(s, "{:.0%}") for s in share),
        )
    Console(stderr=False).print(table)


def _fmt(value: Any, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


class PlanSweepSummary(Callback):
    """Hydra callback: collect each job's plan row; write CSV, PNG and a table at the end."""

    def __init__(self, mode: str = "plan") -> None:
        self.mode = mode
        self.rows: list[dict[str, Any]] = []

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        if job_return.status == JobStatus.COMPLETED and isinstance(job_return.return_value, dict):
            self.rows.append(job_return.return_value)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if not self.rows:
            return
        out = Path(config.hydra.sweep.dir)
        out.mkdir(parents=True, exist_ok=True)
        write_csv(self.rows, out / "plans.csv")
        plot_breakdown(self.rows, self.mode, out / "plans.png")
        print_table(self.rows, self.mode)
        print(f"wrote {out / 'plans.csv'} and {out / 'plans.png'}")

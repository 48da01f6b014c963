"""PNG plots of a run (reward curve, per-step time breakdown) and of a step-time sweep."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from locojax.runtime.observe.metrics import read_metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TIMING_KEYS = ("rollout_s", "reward_s", "advantage_s", "train_s", "transfer_s", "host_other_s")
"""Parts of one step's wall time, stacked bottom to top."""

BARS_UP_TO = 200
"""Up to this many steps the breakdown is drawn as bars; beyond, as a stacked area."""


def pyplot():
    """matplotlib's pyplot, writing files only (no display on hosts or CI); imported on the
    first plot, so the sweep reports and the plan entry point load it only when they draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that hold a number under `key`."""
    pairs = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float)]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def _rl_start(rows: list[dict], rl_start_step: int) -> int:
    """The given RL start, or else the first step whose row says phase 'rl'."""
    if rl_start_step:
        return rl_start_step
    return next((r["step"] for r in rows if r.get("phase") == "rl"), 0)


def plot_run(metrics_path: Path, out_png: Path, rl_start_step: int = 0, title: str = "") -> Path:
    """Reward (accuracy, eval pass@1) vs step with the RL phase marked, and time per step."""
    rows = sorted(read_metrics(metrics_path), key=lambda r: r["step"])
    fig, (ax_r, ax_t) = pyplot().subplots(2, 1, figsize=(9, 7), sharex=True)
    ax_r.plot(*_series(rows, "reward_mean"), label="reward_mean", color="tab:blue")
    if any("accuracy" in r for r in rows):
        ax_r.plot(*_series(rows, "accuracy"), label="accuracy", color="tab:green", alpha=0.8)
    if any("eval_pass1" in r for r in rows):
        ax_r.plot(*_series(rows, "eval_pass1"), "o", label="eval pass@1", color="tab:red")
    rl_start = _rl_start(rows, rl_start_step)
    if rows and rl_start > rows[0]["step"]:
        for ax in (ax_r, ax_t):
            ax.axvline(rl_start, color="black", linestyle="--", linewidth=1)
        ax_r.axvspan(rl_start, rows[-1]["step"], color="tab:orange", alpha=0.08, label="RL phase")
    ax_r.set_ylabel("reward / accuracy")
    ax_r.grid(alpha=0.3)
    ax_r.legend(loc="best", fontsize=8)

    steps = [r["step"] for r in rows]
    keys = [k for k in TIMING_KEYS if any(k in r for r in rows)]
    parts = [[float(r.get(k) or 0.0) for r in rows] for k in keys]
    if keys and len(steps) <= BARS_UP_TO:
        bottom = [0.0] * len(steps)
        for key, values in zip(keys, parts, strict=True):
            ax_t.bar(steps, values, bottom=bottom, width=1.0, label=key)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    elif keys:
        ax_t.stackplot(steps, parts, labels=keys)
    else:
        ax_t.text(0.5, 0.5, "no timing data", ha="center", va="center", transform=ax_t.transAxes)
    ax_t.set_xlabel("step")
    ax_t.set_ylabel("seconds per step")
    ax_t.grid(alpha=0.3)
    if keys:
        totals = [sum(col) for col in zip(*parts, strict=True)]
        ax_t.set_ylim(0, 1.35 * max(max(totals), 1e-9))  # headroom for the legend
        ax_t.legend(loc="upper right", fontsize=8, ncol=3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, out_png)


def plot_sweep(
    rows: list[dict], x_key: str, measured_key: str, predicted_key: str, out_png: Path
) -> Path:
    """Measured vs predicted step time for each value of `x_key`."""
    rows = sorted(rows, key=lambda r: r[x_key])
    xs = [r[x_key] for r in rows]
    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    ax.plot(xs, [r.get(measured_key) for r in rows], "o-", label=f"measured ({measured_key})")
    ax.plot(xs, [r.get(predicted_key) for r in rows], "s--", label=f"predicted ({predicted_key})")
    ax.set_xlabel(x_key)
    ax.set_ylabel("seconds per step")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return _save(fig, out_png)


def _save(fig: Figure, out_png: Path) -> Path:
    """Write `fig` as PNG (creating folders) and free it."""
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    pyplot().close(fig)
    return out

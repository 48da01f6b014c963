"""PNG plots of a run (reward curve, per-step time breakdown) and of a step-time sweep."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from locojax.runtime.observe.metrics import read_metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TIMING_KEYS = ("rollout_s", "reward_s", "advantage_s", "train_s", "transfer_s", "eval_s",
               "host_other_s")
"""Parts of one step's wall time, stacked bottom to top."""

EVAL_SCORES = ("eval_greedy_accuracy", "eval_pass@1")
"""The evaluation's score a run's plot shows: greedy (run.eval_samples=1) or sampled."""

ROLLOUT_SIDE = ("rollout_s", "reward_s", "advantage_s", "eval_s")
"""DA: the rollout hosts' phases of a step (they overlap the trainers')."""
TRAINER_SIDE = ("train_s", "transfer_s")
"""DA: the trainers' phases of a step."""

PHASE_COLORS = {"rollout_s": "tab:blue", "reward_s": "tab:orange", "advantage_s": "tab:green",
                "train_s": "tab:red", "transfer_s": "tab:purple", "eval_s": "tab:pink",
                "host_other_s": "tab:brown"}
"""One colour per phase, the same in every mode's plot."""

BARS_UP_TO = 200
"""Up to this many steps the breakdown is drawn as bars; beyond, as a stacked area."""

STEP_AXIS = "step (metrics.jsonl's index, from 0)"
"""The x label of a run's plot: the rows' `step`, one less than the progress line's count."""


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


def _integer_steps(ax) -> None:
    """Ticks on whole steps only (a 3-step run would otherwise get 0.5, 1.5, ...)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _legend_outside(ax, **kw) -> None:
    """The legend right of the axes, where it hides no bar or line."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8, **kw)


def _overlapped(rows: list[dict]) -> bool:
    """Whether the rows are DA's, whose rollout and training run at the same time."""
    return any("overlap_frac" in r for r in rows)


def _stack(ax, steps: list[int], keys: list[str], rows: list[dict], offset: float = 0.0,
           width: float = 0.8) -> None:
    """`keys` of each row stacked bottom to top, one bar per step (an area past BARS_UP_TO)."""
    parts = [[float(r.get(k) or 0.0) for r in rows] for k in keys]
    if len(steps) > BARS_UP_TO:
        ax.stackplot([s + offset for s in steps], parts, labels=keys, alpha=0.8,
                     colors=[PHASE_COLORS.get(k) for k in keys])
        return
    bottom = [0.0] * len(steps)
    for key, values in zip(keys, parts, strict=True):
        ax.bar([s + offset for s in steps], values, bottom=bottom, width=width, label=key,
               color=PHASE_COLORS.get(key))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]


def _timing(ax, rows: list[dict]) -> None:
    """Seconds per step. One process does the phases one after the other (CO, single): one
    stacked bar per step, whose height is the step. DA's rollout hosts and trainers work at
    the same time: their phases are two bars side by side, and the step's wall time is the
    black line (below the sum of the two)."""
    steps = [r["step"] for r in rows]
    if not any(k in r for k in TIMING_KEYS for r in rows):
        ax.text(0.5, 0.5, "no timing data", ha="center", va="center", transform=ax.transAxes)
        return
    if _overlapped(rows):
        rollout = [k for k in ROLLOUT_SIDE if any(k in r for r in rows)]
        trainer = [k for k in TRAINER_SIDE if any(k in r for r in rows)]
        _stack(ax, steps, rollout, rows, offset=-0.2, width=0.4)
        _stack(ax, steps, trainer, rows, offset=0.2, width=0.4)
        wall = [float(r.get("step_s") or 0.0) for r in rows]
        if len(steps) > BARS_UP_TO:
            ax.plot(steps, wall, color="black", linewidth=1.0, label="step_s (wall time)")
        else:  # one mark across each step's pair of bars
            ax.hlines(wall, [s - 0.45 for s in steps], [s + 0.45 for s in steps],
                      color="black", linewidth=2.0, label="step_s (wall time)")
        ax.set_title("DA: rollout hosts (left bar) and trainers (right bar) overlap; "
                     "black: the step's wall time", fontsize=8)
    else:
        _stack(ax, steps, [k for k in TIMING_KEYS if any(k in r for r in rows)], rows)
    _legend_outside(ax)


def run_figure(rows: list[dict], rl_start_step: int = 0, title: str = "") -> Figure:
    """Reward (accuracy, eval greedy accuracy or pass@1) vs step with the RL phase marked, and
    time per step; integer step ticks, legends beside the axes."""
    rows = sorted(rows, key=lambda r: r["step"])
    fig, (ax_r, ax_t) = pyplot().subplots(2, 1, figsize=(10, 7), sharex=True)
    ax_r.plot(*_series(rows, "reward_mean"), label="reward_mean", color="tab:blue")
    if any("accuracy" in r for r in rows):
        ax_r.plot(*_series(rows, "accuracy"), label="accuracy", color="tab:green", alpha=0.8)
    for key in EVAL_SCORES:
        if any(key in r for r in rows):
            ax_r.plot(*_series(rows, key), "o", label=key.replace("_", " "), color="tab:red")
    rl_start = _rl_start(rows, rl_start_step)
    if rows and rl_start > rows[0]["step"]:
        for ax in (ax_r, ax_t):
            ax.axvline(rl_start, color="black", linestyle="--", linewidth=1)
        ax_r.axvspan(rl_start, rows[-1]["step"], color="tab:orange", alpha=0.08, label="RL phase")
    ax_r.set_ylabel("reward / accuracy")
    ax_r.grid(alpha=0.3)
    _legend_outside(ax_r)
    _timing(ax_t, rows)
    ax_t.set_xlabel(STEP_AXIS)
    ax_t.set_ylabel("seconds per step")
    ax_t.grid(alpha=0.3)
    _integer_steps(ax_t)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_run(metrics_path: Path, out_png: Path, rl_start_step: int = 0, title: str = "") -> Path:
    """`run_figure` of a metrics.jsonl, written as PNG."""
    return _save(run_figure(read_metrics(metrics_path), rl_start_step, title), out_png)


def plot_sweep(rows: list[dict], x_key: str, measured_key: str, predicted_key: str,
               out_png: Path, labels: list[str] | None = None) -> Path:
    """Measured vs predicted step time against the swept key `x_key` (numbers: a numeric
    axis; `labels`, one per row: a category axis in row order, for several swept keys)."""
    if labels is None:
        rows = sorted(rows, key=lambda r: r[x_key])
        xs: list = [r[x_key] for r in rows]
    else:
        xs = list(range(len(rows)))
    fig, ax = pyplot().subplots(figsize=(8, 4.5))
    ax.plot(xs, [r.get(measured_key) for r in rows], "o-", label=f"measured ({measured_key})")
    ax.plot(xs, [r.get(predicted_key) for r in rows], "s--", label=f"predicted ({predicted_key})")
    if labels is not None:
        ax.set_xticks(xs, labels, rotation=30, ha="right", fontsize=7)
    ax.set_xlabel(x_key)
    ax.set_ylabel("seconds per step")
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    fig.tight_layout()
    return _save(fig, out_png)


def _save(fig: Figure, out_png: Path) -> Path:
    """Write `fig` as PNG (creating folders) and free it."""
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    pyplot().close(fig)
    return out

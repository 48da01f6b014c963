"""The driver side of a step, written once for every mode (CO hosts, DA's driver and rollout
actors, the single controller's driver).

    workload + PromptStream ──step_problems(step, range)──> a host's problems of the step
        (dynamic sampling's further batches: `runtime.groups.batch_problems`)
    workload.eval ──eval_problems(share, shares)──> a host's held-out problems; eval_due(step)
    every host's statistics (hosts x STAT_KEYS) + train metrics + phase seconds
        ──metrics_row──> one metrics.jsonl row (every scalar the train step returned but
        TRAIN_INTERNALS, host_other_s, tokens_per_s), in every mode
    each step's mean reward + the last row ──summarize──> RunSummary
        ──close_run──> the reward plot (when a step ran) and the report's table

Where a mode's row differs (DA's overlap, lag and transfer rounds) it adds fields to the row
these functions make; it never writes the shared ones a second way.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from locojax.data import Problem, PromptStream, Workload, shard
from locojax.runtime.observe.plots import plot_run
from locojax.runtime.observe.progress import already_complete, print_summary
from locojax.runtime.observe.stats import reward_fields
from locojax.runtime.process.stop import atomic
from locojax.runtime.rundir.files import METRICS_FILE, REWARDS_PLOT

FINAL_WINDOW = 10
"""Steps averaged into the reported final reward (one step's mean is noisy)."""
TRAIN_INTERNALS = ("params_finite", "response_tokens")
"""Scalars the train step returns for the runtime's own use (the NaN guard's check, the token
count behind its means); every other scalar it returns is a column of the row."""
PHASE_KEYS = ("rollout_s", "reward_s", "advantage_s", "train_s", "transfer_s")
"""The phases of a step; what they (and `eval_s`, on evaluation steps) leave of `step_s` is
`host_other_s`."""


def step_problems(workload: Workload, stream: PromptStream, step: int,
                  prompt_range: tuple[int, int]) -> list[Problem]:
    """The problems of `step` in `prompt_range` of the step's prompts (one stream for all)."""
    start, stop = prompt_range
    return [workload.train[int(i)] for i in stream.batch(step, start, stop)]


def eval_problems(workload: Workload, eval_prompts: int, share: int,
                  shares: int) -> list[Problem]:
    """Share `share` of `shares` of the first `eval_prompts` held-out problems."""
    problems = list(workload.eval[:min(len(workload.eval), eval_prompts)])
    return shard(problems, share, shares)


def eval_due(step: int, steps: int, every: int) -> bool:
    """Whether the greedy evaluation runs after `step` (every `every` steps and the last)."""
    done = step + 1
    return bool(every) and (done % every == 0 or done == steps)


def train_fields(metrics: dict) -> dict[str, float]:
    """Every scalar of the train step's metrics but TRAIN_INTERNALS, as floats. A metric the
    step did not measure (kl without a reference, the mismatch without the sampler's
    log-probs) is absent, never 0."""
    return {k: float(v) for k, v in metrics.items()
            if k not in TRAIN_INTERNALS and np.ndim(v) == 0}


def metrics_row(step: int, stats_HxK: np.ndarray, metrics: dict, times: dict,
                fn_names: tuple[str, ...] = ()) -> dict:
    """One metrics.jsonl row: every host's reward statistics, the train metrics and the phase
    seconds (`times` holds `step_s`, each of PHASE_KEYS not in the statistics and, on an
    evaluation step, `eval_s`; `fn_names`: the reward functions of the user's)."""
    row = {**reward_fields(step, stats_HxK, fn_names), **train_fields(metrics), **times}
    spent = sum(row[k] for k in PHASE_KEYS) + row.get("eval_s", 0.0)
    row["host_other_s"] = max(row["step_s"] - spent, 0.0)
    row["tokens_per_s"] = row["tokens"] / max(row["step_s"], 1e-9)
    return row


CUT_PROMPTS_WARN = 0.05
"""The share of a run's first batch of prompts cut on the left past which it says so."""


def cut_prompts_warning(row: dict, prompts: int) -> str | None:
    """One line naming `workload.max_prompt_len` when more than CUT_PROMPTS_WARN of the
    `prompts` a row's step sampled were cut to it (`prompts_truncated`); None otherwise."""
    cut = row.get("prompts_truncated", 0)
    if cut <= CUT_PROMPTS_WARN * prompts:
        return None
    return (f"{cut} of {prompts} prompts of the first step ({cut / prompts:.0%}) were longer "
            "than workload.max_prompt_len and were cut on the left (their template's start "
            "dropped): raise workload.max_prompt_len")


@dataclass(frozen=True)
class RunSummary:
    """What a finished run reports."""

    first_reward: float
    last_reward: float
    last_accuracy: float
    steps: int
    """Steps this invocation ran (0: the run was already complete)."""
    total_steps: int
    """run.steps: the step the run ends at."""
    seconds: float
    plot: Path | None
    export: Path | None
    sft_loss: tuple[float, float] | None
    episodes: str | None = None
    """A multi-turn run's last step: turns, tool calls and errors, truncation (None: one
    reply an episode)."""


def episodes_line(row: dict) -> str | None:
    """`turns 2.4 mean, 4 max; 12 tool calls (1 failed); 0 env errors; 5% truncated; devices
    idle 8% of the rollout` of a multi-turn row; None for a single-turn one (no
    `turns_mean`)."""
    if "turns_mean" not in row:
        return None
    return (f"turns {row['turns_mean']:.1f} mean, {row['turns_max']:.0f} max; "
            f"{row['tool_calls']:.0f} tool calls ({row['tool_errors']:.0f} failed); "
            f"{row['env_errors']:.0f} env errors; {row['truncated_frac']:.0%} truncated; "
            f"devices idle {row['device_idle_frac']:.0%} of the rollout")


def summarize(rewards: Sequence[float], last_row: dict, start: int, total_steps: int,
              seconds: float, *, plot: Path | None = None, export: Path | str | None = None,
              sft_loss: tuple[float, float] | None = None) -> RunSummary:
    """The summary of a run that started at step `start` and whose steps had mean rewards
    `rewards` (last row `last_row`)."""
    return RunSummary(
        first_reward=rewards[0] if rewards else float("nan"),
        last_reward=float(np.mean(rewards[-FINAL_WINDOW:])) if rewards else float("nan"),
        last_accuracy=last_row.get("accuracy", float("nan")), steps=total_steps - start,
        total_steps=total_steps, seconds=seconds, plot=plot,
        export=None if export is None else Path(export), sft_loss=sft_loss,
        episodes=episodes_line(last_row))


def report(summary: RunSummary, run_dir: Path, title: str = "LoCoJAX run") -> None:
    """End-of-run summary table (primary host or driver); one line for a run that was already
    complete."""
    if summary.steps == 0:  # a rerun past the checks of `launch.dispatch.finished`: it exported
        print(already_complete(summary.total_steps, run_dir, summary.export,
                               exported=summary.export is not None), file=sys.stderr)
        return
    rows = [
        ("steps run", str(summary.steps)),
        (f"reward (first step -> mean of last {FINAL_WINDOW})",
         f"{summary.first_reward:.3f} -> {summary.last_reward:.3f}"),
        ("accuracy (last step)", "not reported (no correct answer defined)"
         if math.isnan(summary.last_accuracy) else f"{summary.last_accuracy:.3f}"),
        ("wall time", f"{summary.seconds:.1f} s"),
        ("metrics", str(run_dir / METRICS_FILE)),
        ("plot", str(summary.plot)),
        ("final policy (HF)", str(summary.export)),
    ]
    if summary.episodes is not None:
        rows.insert(3, ("episodes (last step)", summary.episodes))
    if summary.sft_loss is not None:
        rows.insert(1, ("supervised warm-up loss", f"{summary.sft_loss[0]:.3f} -> "
                                                   f"{summary.sft_loss[1]:.3f} (before RL)"))
    print_summary(rows, title)


def close_run(summary: RunSummary, run_dir: Path, plot_title: str,
              title: str = "LoCoJAX run") -> RunSummary:
    """The end of every mode's run on its primary process: the reward plot of metrics.jsonl
    when a step ran, then the report; the summary with its plot. A signal meanwhile waits for
    both (a second or so), then says the run had finished (`stop.final_export`)."""
    with atomic():
        if summary.steps:
            plot = plot_run(run_dir / METRICS_FILE, run_dir / REWARDS_PLOT, title=plot_title)
            summary = dataclasses.replace(summary, plot=plot)
        report(summary, run_dir, title)
    return summary

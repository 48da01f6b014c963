"""The step loop of every mode, written once: the order of a step, the stop on a signal, the
evaluation cadence, the metrics row, the progress line and the epilogue.

    mode.begin(log)  ──> Begun(step, warm-up loss): restore | init + warm-up (the mode's)
    for step in [start, run.steps):
        mode.step(step, stop, emit) ──> emit(each step it finished, as soon as it is: CO,
            single: this one; DA: the one before, whose row waited for the rollout
            overlapping it) ──> the signal every process agreed to stop on (CO: voted in
            its statistics all-gather)
        emit: mode.evaluate when eval_due ──> metrics_row ──> metrics.jsonl, TensorBoard,
            trackers (MetricsWriter), the progress line
        a signal: the steps still pending are written, mode.save_now(done) ──> `Stopped`
    mode.drain() (the pending row), one more vote (a signal during the last evaluation or
        row: saved, `Stopped`, no export)
    final_export(): mode.finish() ──> the HF export ──> RunSummary

A mode supplies only what differs: where rollout and host work run and how the train step
is reached (`Mode`). A new phase of every step goes into the host-local episode
(`runtime.episode`) or here, once.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from compiler.plan import ExecutionPlan
from locojax.runtime.observe.metrics import MetricsWriter
from locojax.runtime.observe.progress import StepProgress
from locojax.runtime.process.stop import Stopped, StopSignals, final_export
from locojax.runtime.steps import (
    RunSummary,
    cut_prompts_warning,
    eval_due,
    metrics_row,
    summarize,
)


@dataclass(frozen=True)
class Begun:
    """Where a mode's run begins."""

    step: int
    """The first step to run (the restored checkpoint's, else 0)."""
    sft_loss: tuple[float, float] | None = None
    """The supervised warm-up's first and last loss, when one ran."""


@dataclass(frozen=True)
class StepDone:
    """One trained step, ready for its metrics row."""

    step: int
    began: float
    """time.time() when the step began."""
    stats_HxK: np.ndarray
    """Every host's statistics (`observe.stats.STAT_KEYS`)."""
    metrics: dict
    """The train step's metrics."""
    times: dict
    """Phase seconds, host work and the mode's own fields; `step_s` when the mode measures
    it itself (DA: from this step's start to the next's), else the loop's clock."""
    pending: object = field(default=None, compare=False)
    """The mode's own state for `evaluate` (DA: the rollout actors' evaluation refs)."""


class Mode(Protocol):
    """What a mode (CO host, single controller's driver, DA's driver) supplies to the loop."""

    progress_keys: dict[str, str]
    """Progress-line label -> row key, beyond the reward and step time."""

    def begin(self, log) -> Begun:
        """Restore or initialise (and warm up) the policy; say where it starts in `log`."""

    def step(self, step: int, stop: StopSignals, emit: Callable[[StepDone], None]
             ) -> int | None:
        """Run `step`, calling `emit` with each step it finishes as soon as it is (its row
        survives a failure later in the step); the signal to stop on after it. `stop.flag`
        read at the step's end is this process's vote (the signal number, 0: none)."""

    def evaluate(self, done: StepDone) -> dict[str, float]:
        """Held-out evaluation fields of `done`'s step (eval_s included when the mode
        measured it)."""

    def drain(self) -> list[StepDone]:
        """The steps trained but not yet returned (DA's last, overlapped step)."""

    def vote(self, flag: float) -> int | None:
        """The signal every process stops on after the last step (None: none)."""

    def save_now(self, done: int) -> Path:
        """Save the state after `done` steps and wait for it; its directory."""

    def finish(self) -> Path | None:
        """Wait for the saves; export the final policy (the primary's path)."""


class _Rows:
    """The rows of a run: written, shown and remembered for the summary."""

    def __init__(self, mode: Mode, plan: ExecutionPlan, writer: MetricsWriter,
                 progress: StepProgress):
        self.mode, self.plan, self.writer, self.progress = mode, plan, writer, progress
        self.rewards: list[float] = []
        self.last: dict = {}

    def write(self, done: StepDone) -> None:
        """`done`'s row (with its evaluation when due) to every sink and the progress line."""
        plan = self.plan
        evaluated = {}
        if eval_due(done.step, plan.run.steps, plan.run.eval_every):
            t0 = time.time()
            evaluated = self.mode.evaluate(done)
            evaluated.setdefault("eval_s", time.time() - t0)
        times = {"step_s": time.time() - done.began, **done.times, **evaluated}
        row = metrics_row(done.step, done.stats_HxK, done.metrics, times,
                          tuple(plan.workload.reward_fns))
        self.writer.write(row)
        if not self.rewards:
            cut = cut_prompts_warning(row, row.get("groups_sampled") or
                                      plan.batch.prompts_per_step)
            if cut:
                logging.getLogger(__name__).warning(cut)
        self.rewards.append(row["reward_mean"])
        self.last = row
        shown = {label: row[key] for label, key in self.mode.progress_keys.items()}
        self.progress.update(done.step + 1, reward=row["reward_mean"], step_s=row["step_s"],
                             **shown)


def _warn(line: str) -> None:
    """A warning of the run's own (stderr, one line)."""
    print(line, file=sys.stderr, flush=True)


def _steps(mode: Mode, first: int, steps: int, stop: StopSignals, rows: _Rows) -> None:
    """Steps [first, steps) and their rows; `Stopped` after saving the step at whose end a
    signal came (and after the last step, when one came during its evaluation or row)."""
    for step in range(first, steps):
        signum = mode.step(step, stop, rows.write)
        if signum is not None:
            for done in mode.drain():
                rows.write(done)
            raise Stopped(signum, step + 1, mode.save_now(step + 1))
    for done in mode.drain():
        rows.write(done)
    signum = mode.vote(stop.flag)
    if signum is not None:
        raise Stopped(signum, steps, mode.save_now(steps))


def run_loop(mode: Mode, plan: ExecutionPlan, run_dir: Path, *, primary: bool = True,
             log=print, began: float | None = None) -> RunSummary:
    """The run of `mode`: its start, every step with its row, the export; the summary every
    mode reports. `primary`: this process writes the rows and shows the progress (CO's host
    0, a Ray driver). Raises `Stopped` on a signal (saved), `NonFinite` from a mode's train
    step, and whatever the mode raises. `began`: time.time() when the run began (default
    now), for the summary's wall time."""
    began = time.time() if began is None else began
    start = mode.begin(log if primary else (lambda _: None))
    writer = MetricsWriter(run_dir, enabled=primary, plan=plan)
    writer.truncate_from(start.step, warn=_warn)
    try:
        with StopSignals() as stop, StepProgress(plan.run.steps, start_step=start.step,
                                                 enabled=primary) as progress:
            rows = _Rows(mode, plan, writer, progress)
            _steps(mode, start.step, plan.run.steps, stop, rows)
    finally:
        writer.close()
    with final_export():  # a signal waits for the last save and the export
        export = mode.finish()
    return summarize(rows.rewards, rows.last, start.step, plan.run.steps, time.time() - began,
                     export=export, sft_loss=start.sft_loss)

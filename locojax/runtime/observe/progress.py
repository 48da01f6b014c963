"""Step progress on stderr (a rich bar on a terminal, one plain line per step otherwise) and the
run summary, in the same form in every mode.

Without a terminal (a batch system's log, a pipe, CI) rich would wrap and cut at 80 columns
(`…/outputs/2026-12…`, `1.09e…`); `uncut_console()` gives such output a width no line reaches.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from locojax.runtime.rundir.files import METRICS_FILE

UNCUT_WIDTH = 10_000
"""Columns of a console that is not a terminal: wider than any line, so none is cut."""


def uncut_console(stderr: bool = True) -> Console:
    """A rich console on stderr (or stdout); when it is not a terminal, wide enough that
    tables and lines are never wrapped or cut with an ellipsis."""
    out = Console(stderr=stderr)
    return out if out.is_terminal else Console(stderr=stderr, width=UNCUT_WIDTH)


def _fmt_value(value: Any) -> str:
    """Short human form of a shown metric."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _fmt_duration(seconds: float) -> str:
    """h:mm:ss (or '?' when unknown)."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class StepProgress:
    """Context manager: `update(step, **shown)` after each finished step (1-based count)."""

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        enabled: bool = True,
        console: Console | None = None,
    ):
        self.total = total_steps
        self.start = start_step
        self.enabled = enabled
        self.console = console or uncut_console()  # stderr: stdout stays clean
        self._progress: Progress | None = None
        self._task = None
        self._t_start = self._t_last = 0.0

    def __enter__(self) -> StepProgress:
        self._t_start = self._t_last = time.perf_counter()
        if self.enabled and self.console.is_terminal:
            self._progress = Progress(
                TextColumn("step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("{task.fields[info]}"),
                console=self.console,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "run", total=self.total, completed=self.start, info=""
            )
        return self

    def update(self, step: int, **shown: Any) -> None:
        """Record that `step` of `total_steps` steps are done; `shown` are metrics to display."""
        if not self.enabled:
            return
        now = time.perf_counter()
        step_s, self._t_last = now - self._t_last, now
        done = step - self.start
        eta = (now - self._t_start) / done * (self.total - step) if done > 0 else math.inf
        info = " ".join(f"{k}={_fmt_value(v)}" for k, v in shown.items())
        info = f"{info} | {step_s:.3g} s/step | ETA {_fmt_duration(eta)}".lstrip(" |")
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)
            return
        # Not a terminal: one whole line per step (a log file keeps every step).
        pct = 100 * step / self.total if self.total else 100.0
        self.console.print(f"step {step}/{self.total} ({pct:.0f}%) {info}", markup=False,
                           highlight=False, soft_wrap=True)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def already_complete(total_steps: int, run_dir: Path, export: Path | None,
                     exported: bool = False) -> str:
    """The one line of a rerun of a run that has done every step (`exported`: its HF export
    was missing or of an earlier step, and this rerun wrote it)."""
    again = "; its HF export was missing or older: written again" if exported else ""
    return (f"already complete at step {total_steps}: nothing to run (raise run.steps to train "
            f"on){again}; metrics {run_dir / METRICS_FILE}, final policy {export}")


def print_summary(
    rows: list[tuple[str, str]], title: str = "Run summary", console: Console | None = None
) -> None:
    """End-of-run table of (name, value) rows on stderr (never cut: `uncut_console`)."""
    table = Table(title=title, show_header=False)
    table.add_column("name", style="bold")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    (console or uncut_console()).print(table)

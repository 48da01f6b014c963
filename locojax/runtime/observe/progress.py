"""Step progress on stderr (a rich bar on a TTY, sparse plain lines in CI) and the run summary."""

from __future__ import annotations

import math
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

PLAIN_EVERY_S = 10.0
"""Without a TTY, print at least this often (and about every 10% of the steps)."""


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
        self.console = console or Console(stderr=True)  # stdout stays clean
        self._progress: Progress | None = None
        self._task = None
        self._t_start = self._t_last = 0.0
        self._last_printed_step = start_step
        self._last_print_t = 0.0
        self._every = max(1, math.ceil((total_steps - start_step) / 10))

    def __enter__(self) -> StepProgress:
        self._t_start = self._t_last = self._last_print_t = time.perf_counter()
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
        due = (
            (step - self.start) // self._every
            > (self._last_printed_step - self.start) // self._every
            or now - self._last_print_t >= PLAIN_EVERY_S
            or step >= self.total
            or done == 1  # the first step shows the run started (and its compile time)
        )
        if due:
            pct = 100 * step / self.total if self.total else 100.0
            self.console.print(
                f"step {step}/{self.total} ({pct:.0f}%) {info}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            self._last_printed_step, self._last_print_t = step, now

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def print_summary(
    rows: list[tuple[str, str]], title: str = "Run summary", console: Console | None = None
) -> None:
    """End-of-run table of (name, value) rows on stderr."""
    table = Table(title=title, show_header=False)
    table.add_column("name", style="bold")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    (console or Console(stderr=True)).print(table)

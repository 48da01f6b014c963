"""Per-step metrics: one JSON line per step in run_dir/metrics.jsonl, TensorBoard scalars and
the trackers of `run.loggers` (`observe.trackers`: wandb, MLflow), on the primary host only."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from compiler import ExecutionPlan
from compiler.config import Logger
from locojax.runtime.observe.trackers import Trackers
from locojax.runtime.process.stop import atomic
from locojax.runtime.rundir.files import METRICS_FILE, TB_DIR, write_atomic


def to_json_value(value: Any) -> Any:
    """Plain-JSON form of a metric: numpy/jax scalars -> int/float, arrays -> lists."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | float | str) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(v) for v in value]
    if hasattr(value, "__array__"):  # numpy scalars/arrays and jax arrays (fetched to host)
        arr = np.asarray(value)
        return arr.item() if arr.ndim == 0 else arr.tolist()
    return str(value)


def _finite_or_none(value: Any) -> Any:
    """NaN/inf are not JSON numbers; store them as null so any JSON reader can load the row."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _row_problem(line: bytes) -> tuple[dict | None, str]:
    """(the metrics row a line holds, "") or (None, why it holds none)."""
    try:
        row = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except (ValueError, RecursionError):
        return None, "not JSON (a run killed mid-write leaves such a last line)"
    if not isinstance(row, dict):
        return None, f"{type(row).__name__}, not a JSON object"
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None, f"no step number ('step': {json.dumps(step)[:20]})"
    return row, ""


def read_rows(path: Path) -> tuple[list[dict], list[tuple[int, str]]]:
    """(every row of a metrics.jsonl file: a JSON object with an integer 'step' >= 0, and
    (line number, why) of each other non-empty line, skipped): a torn last line of a killed
    run, a line that is not JSON, not UTF-8 or not a row."""
    rows, skipped = [], []
    for number, line in enumerate(Path(path).read_bytes().split(b"\n"), 1):
        if not line.strip():
            continue
        row, why = _row_problem(line)
        if row is None:
            skipped.append((number, why))
        else:
            rows.append(row)
    return rows, skipped


def read_metrics(path: Path) -> list[dict]:
    """Every row of a metrics.jsonl file (`read_rows`; the lines that are no row skipped)."""
    return read_rows(path)[0]


def skipped_line(path: Path, skipped: list[tuple[int, str]]) -> str:
    """The one warning of a resume that dropped the lines of `path` that are no row."""
    number, why = skipped[0]
    more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
    return (f"warning: {path}: line {number} is not a metrics row ({why}){more}; skipped and "
            "dropped from the file (its step, if any, is run again)")


class MetricsWriter:
    """Appends one row per step; a disabled writer (non-zero hosts) does nothing."""

    def __init__(self, run_dir: Path, enabled: bool = True, plan: ExecutionPlan | None = None):
        """`plan`: its `run.loggers` choose TensorBoard and the trackers (None: JSONL and
        TensorBoard)."""
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.enabled = enabled
        self._file = None
        self._tb = None
        self._trackers = None
        if enabled:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
            if plan is None or Logger.tensorboard in plan.run.loggers:
                from tensorboardX import SummaryWriter  # import only where it writes

                self._tb = SummaryWriter(str(self.run_dir / TB_DIR))
            self._trackers = Trackers(plan, self.run_dir)

    def write(self, row: dict[str, Any]) -> None:
        """Append `row` (must hold an int 'step') to the JSONL file and TensorBoard."""
        if not self.enabled:
            return
        clean = {k: _finite_or_none(v) for k, v in to_json_value(row).items()}
        step = int(clean["step"])
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()  # rows survive a killed run
        if self._tb is not None:
            for key, value in clean.items():
                if key != "step" and isinstance(value, int | float) \
                        and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, global_step=step)
            self._tb.flush()
        self._trackers.log(step, clean)

    def truncate_from(self, step: int, warn: Callable[[str], None] | None = None) -> int:
        """Drop rows with row['step'] >= step (before resuming there) and the lines that are
        no row (`read_rows`; `warn` gets the one line that says so); returns rows kept."""
        if not self.enabled:
            return 0
        rows, skipped = read_rows(self.path)
        if skipped and warn is not None:
            warn(skipped_line(self.path, skipped))
        kept = [r for r in rows if r["step"] < step]
        self._file.close()
        with atomic():  # a signal waits: no temp file is left behind
            write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        # TensorBoard keeps the old events; a reader shows the newest value per step.
        return len(kept)

    def close(self) -> None:
        """Flush and close the file and the TensorBoard writer."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._trackers is not None:
            self._trackers.close()
            self._trackers = None
        self.enabled = False

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

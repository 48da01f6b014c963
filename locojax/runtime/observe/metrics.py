"""Per-step metrics: one JSON line per step in run_dir/metrics.jsonl, TensorBoard scalars and
the trackers of `run.loggers` (`observe.trackers`: wandb, MLflow), on the primary host only."""

from __future__ import annotations

import json
import math
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


def read_metrics(path: Path) -> list[dict]:
    """Every row of a metrics.jsonl file (a torn last line from a killed run is skipped)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # only a run killed mid-write leaves one; its step is simply redone
    return rows


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

    def truncate_from(self, step: int) -> int:
        """Drop rows with row['step'] >= step (before resuming there); returns rows kept."""
        if not self.enabled:
            return 0
        kept = [r for r in read_metrics(self.path) if int(r["step"]) < step]
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

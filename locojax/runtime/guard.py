"""The NaN guard: a step whose loss, gradient norm or updated parameters are not finite stops
the run before anything of it is saved.

    jitted step -> metrics: loss, grad_norm, params_finite (one fused reduction over the
                   updated parameters, inside the step: no extra program, no extra sync)
    Trainer.train: the metrics it fetches anyway -> `non_finite(metrics)` -> a name? ->
                   wait for the saves already started, raise `NonFinite` (one line: the
                   step, the metric, the last good checkpoint, nothing exported)
    the door: `error: <line>`, exit 1 (the run failed; exit 2 is kept for bad input)

The metrics are replicated outputs of the one global step, so every CO host and every DA
trainer actor sees the same values and stops at the same step.
"""

from __future__ import annotations

import math
from pathlib import Path

from locojax.train.step import PARAMS_FINITE

GUARDED = ("loss", "grad_norm")
"""Step metrics that must be finite (in this order; the first bad one is named)."""


def non_finite(metrics: dict[str, float]) -> str | None:
    """`grad_norm is nan` for the first non-finite guarded metric, or the parameters; None
    when the step is sound."""
    for key in GUARDED:
        if key in metrics and not math.isfinite(metrics[key]):
            return f"{key} is {metrics[key]}"
    if metrics.get(PARAMS_FINITE, 1.0) != 1.0:
        return "the updated parameters hold nan or inf"
    return None


def stop_line(step: int, what: str, last_good: int | None, checkpoints: Path,
              phase: str = "step") -> str:
    """The one line of a non-finite step (`step` counts from 1, as checkpoints do)."""
    kept = (f"the last good checkpoint is step {last_good} ({checkpoints / str(last_good)})"
            if last_good is not None else "no checkpoint was saved yet")
    return (f"{phase} {step}: {what}; {kept}; nothing exported (lower "
            "algorithm.learning_rate or algorithm.grad_clip in a new hydra.run.dir, or check "
            "the data)")

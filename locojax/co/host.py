"""One host's share of a plan (`run_here`): every CO host of a run, joined or alone, ends here.

The launcher imports this module only after it has set the process's CPU device count (it
loads JAX).
"""

from __future__ import annotations

import logging
from pathlib import Path

from compiler import ExecutionPlan
from locojax.co.loop import plot_title, run_host
from locojax.runtime.steps import close_run


def run_here(plan: ExecutionPlan, run_dir: Path, host_index: int) -> int:
    """Run this process's host of the plan (a user error goes up to the entry point's door)."""
    # Orbax logs every save step at INFO through absl; keep the run's output to our own lines.
    logging.getLogger("absl").setLevel(logging.WARNING)

    summary = run_host(plan, run_dir, host_index)
    if host_index == 0:
        close_run(summary, run_dir, plot_title(plan))
    return 0

"""One host's share of a plan (`run_here`): every host of a run, joined or alone, ends here."""

from __future__ import annotations

import logging
from pathlib import Path

from compiler import ExecutionPlan


def run_here(plan: ExecutionPlan, run_dir: Path, host_index: int) -> int:
    """Run this process's host of the plan (a user error goes up to the entry point's door)."""
    from locojax.runtime.loop import report, run_host  # JAX: after the CPU device count is set

    # Orbax logs every save step at INFO through absl; keep the run's output to our own lines.
    logging.getLogger("absl").setLevel(logging.WARNING)

    summary = run_host(plan, run_dir, host_index)
    if host_index == 0:
        report(summary, run_dir)
    return 0


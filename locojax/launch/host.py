"""One host's share of a plan; `python -m locojax.launch.host <run dir>` is an emulated host.

The local launcher starts one such process per emulated host: it reads the plan the launcher
wrote (never the raw config), joins `jax.distributed`, and runs its host's share of every step.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from compiler import ExecutionPlan
from locojax.launch.door import door
from locojax.runtime.run_dir import load_plan


def run_here(plan: ExecutionPlan, run_dir: Path, host_index: int) -> int:
    """Run this process's host of the plan (a user error goes up to the entry point's door)."""
    from locojax.runtime.loop import report, run_host  # JAX: after the CPU device count is set

    # Orbax logs every save step at INFO through absl; keep the run's output to our own lines.
    logging.getLogger("absl").setLevel(logging.WARNING)

    summary = run_host(plan, run_dir, host_index)
    if host_index == 0:
        report(summary, run_dir)
    return 0


def main(argv: list[str]) -> int:
    run_dir = Path(argv[0])
    plan = load_plan(run_dir)
    from locojax.runtime.distributed import init_distributed

    info = init_distributed(plan.controller.heartbeat_timeout_s)
    return run_here(plan, run_dir, info.process_index)


if __name__ == "__main__":
    door(lambda: main(sys.argv[1:]), hydra_app=False)

"""`python -m locojax.host <run dir>`: one emulated host started by the local launcher.

Reads the plan the launcher wrote (never the raw config), joins `jax.distributed`, and runs
its host's share of every step.
"""

from __future__ import annotations

import sys
from pathlib import Path

from locojax.run import load_plan, run_here
from locojax.runtime.distributed import init_distributed


def main(argv: list[str]) -> int:
    run_dir = Path(argv[0])
    plan = load_plan(run_dir)
    info = init_distributed(plan.controller.heartbeat_timeout_s)
    return run_here(plan, run_dir, info.process_index)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Each DA actor's share of a step: a rollout host's prompts, a trainer's rows.

(The actors build their `Host` with `build_host(plan, host, trains=...)`: a rollout actor has
no part in training; a trainer's training mesh spans the trainer actors' devices only.)
"""

from __future__ import annotations

from compiler.plan import ExecutionPlan


def rollout_prompt_range(plan: ExecutionPlan, host_index: int) -> tuple[int, int]:
    """[start, stop) of each step's prompts rollout host `host_index` samples."""
    for r in plan.batch.prompt_ranges:
        if r.host == host_index:
            return r.start, r.stop
    raise ValueError(f"host {host_index} has no prompt range in the plan (not a rollout host)")


def trainer_row_range(plan: ExecutionPlan, rank: int, rows: int) -> tuple[int, int]:
    """[start, stop) of the step's rows trainer process `rank` feeds to the global batch."""
    n = len(plan.partitions.trainer_hosts)
    return rows * rank // n, rows * (rank + 1) // n

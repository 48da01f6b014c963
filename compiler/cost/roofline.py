"""The efficiency a compiled program allows: its roofline fraction, from the compiler's counts.

    plan (cost model's FLOPs, ideal bytes) --+
                                             +--> fraction = model's work / compiled work
    compiled program (FLOPs, bytes accessed) +

- train step: the cost model's FLOPs (3 x forward: 6 x params x tokens + causal attention,
  the head on the response columns) over the compiler's matmul FLOPs with loop bodies
  multiplied out: at the chip's peak the step runs the model's FLOPs at this fraction of it
  (remat's recompute, masked attention blocks and a recomputed head lower it);
- slot loop (one decode step): the ideal bytes (the rollout weights once and the live KV of
  every slot at the mean context, prompt + response / 2) over the compiler's bytes accessed
  of one loop iteration: at the chip's HBM bandwidth a decode step runs at this fraction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compiler.plan import ExecutionPlan


def decode_ideal_bytes(plan: ExecutionPlan) -> float:
    """One decode step's ideal bytes per device: the rollout weights once and the KV every
    slot holds at the mean context (prompt + half the response)."""
    b = plan.batch
    context = (b.max_prompt_len + b.response_len / 2) / b.seq_len
    return plan.sharding.rollout.bytes_per_device + b.slots * b.kv_bytes_per_sequence * context


def ceiling(plan: ExecutionPlan, program: Mapping[str, Any]) -> float | None:
    """The fraction (module docstring) of one compiled program's report (`name`, `flops`,
    `plan_flops`, `bytes_accessed`): the train step's and the slot loop's; None for the
    others."""
    if program["name"] == "train_step" and program["flops"] > 0:
        return program["plan_flops"] / program["flops"]
    if program["name"] == "rollout_slots" and program.get("bytes_accessed", 0) > 0:
        return decode_ideal_bytes(plan) / program["bytes_accessed"]
    return None

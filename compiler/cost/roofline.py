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

The cost model's TPU entries (`conf/hardware/{v5e,v6e,v5p,v7x}.yaml`) take train_efficiency
and decode_efficiency as `fitted` over their generation's characterization rows (docs/aot.md,
"Efficiency from the compiled programs"; held by tests/compiler/test_roofline_fit.py); with
`aot=true` a plan's cost section takes its own compiled programs' fractions instead
(`with_compiled_cost`). Prefill has no measured fraction (its efficiency stays assumed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from compiler.config import CostConstants
from compiler.cost.estimate import estimate_plan
from compiler.cost.memory import kv_columns
from compiler.plan import ExecutionPlan

CONSTANT_OF = {"train_step": "train_efficiency", "rollout_slots": "decode_efficiency"}
"""Program -> the cost constant its fraction measures."""


def decode_ideal_bytes(plan: ExecutionPlan) -> float:
    """One decode step's ideal bytes per device: the rollout weights once and the KV every
    slot holds at the mean context (prompt + half the response)."""
    b, model = plan.batch, plan.model.config
    context = (kv_columns(model, b.max_prompt_len + b.response_len / 2, ring=True)
               / kv_columns(model, b.seq_len, ring=True))
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


def fitted(fractions: Iterable[float]) -> float:
    """The one efficiency that best predicts every fraction in log terms (least squares of
    log fraction: their geometric mean). Raises ValueError on none or a non-positive one."""
    values = list(fractions)
    if not values or min(values) <= 0:
        raise ValueError(f"fractions must be positive and at least one: {values}")
    return math.exp(sum(map(math.log, values)) / len(values))


@dataclass(frozen=True)
class CompiledCost:
    """A plan's cost constants with the efficiencies its own compiled programs allow."""

    cost: CostConstants
    """The hardware entry's constants, train_efficiency and decode_efficiency replaced where
    the program was compiled."""
    fractions: Mapping[str, float]
    """Cost constant -> the compiled program's fraction, before capping."""
    capped: tuple[str, ...]
    """Constants whose fraction passed 1 (the cost model counts more than the compiled
    program computes), taken as 1."""


def compiled_cost(plan: ExecutionPlan, programs: Sequence[Mapping[str, Any]]) -> CompiledCost:
    """`plan`'s hardware cost constants with the compiled `programs`' fractions (`ceiling`)."""
    base = plan.topology.hardware.cost
    fractions = {CONSTANT_OF[p["name"]]: f for p in programs
                 if p["name"] in CONSTANT_OF and (f := ceiling(plan, p)) is not None}
    capped = tuple(k for k, f in fractions.items() if f > 1.0)
    used = {k: min(f, 1.0) for k, f in fractions.items()}
    if not used:
        return CompiledCost(base, fractions, capped)
    note = ", ".join(f"{k} {v:.3f}" for k, v in used.items())
    cost = replace(base, **used, source=f"{base.source}; aot=true: {note} from this plan's "
                   "compiled programs (compiler.cost.roofline)")
    return CompiledCost(cost, fractions, capped)


def with_compiled_cost(plan: ExecutionPlan, programs: Sequence[Mapping[str, Any]]
                       ) -> ExecutionPlan:
    """`plan` with its cost section estimated again under `compiled_cost` (same layout: the
    placement was chosen with the hardware entry's constants)."""
    return replace(plan, cost=estimate_plan(plan, compiled_cost(plan, programs).cost))

"""What the cost model reads of a run: the same numbers from a `Config` or from a compiled plan.

`CostInputs` is the part of a configuration the estimate uses (model, workload, algorithm,
sampling, hardware and placement groups). `Config` has it; `PlanCostInputs.of(plan)` takes it
from a plan, so re-estimating a plan (calibration) needs no rebuilt `Config`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from compiler.config import (
    AlgorithmConfig,
    CostConstants,
    HardwareSpec,
    ModelConfig,
    PlacementConfig,
    SamplingConfig,
    WorkloadConfig,
)
from compiler.plan import ExecutionPlan


class CostInputs(Protocol):
    """The configuration groups the cost model reads (a `Config` is one)."""

    @property
    def model(self) -> ModelConfig: ...
    @property
    def workload(self) -> WorkloadConfig: ...
    @property
    def algorithm(self) -> AlgorithmConfig: ...
    @property
    def sampling(self) -> SamplingConfig: ...
    @property
    def hardware(self) -> HardwareSpec: ...
    @property
    def placement(self) -> PlacementConfig: ...


@dataclass(frozen=True)
class PlanCostInputs:
    """A compiled plan's cost inputs: what `compile_plan` gave the estimate for it."""

    model: ModelConfig
    workload: WorkloadConfig
    algorithm: AlgorithmConfig
    sampling: SamplingConfig
    hardware: HardwareSpec
    placement: PlacementConfig
    """The resolved placement. The plan's own mode then costs what `compile_plan` predicted for it;
    the other modes may differ from the plan's (a CO plan keeps no DA staleness setting)."""

    @classmethod
    def of(cls, plan: ExecutionPlan, cost: CostConstants | None = None) -> PlanCostInputs:
        """The plan's inputs, with the hardware entry's cost constants replaced by `cost`."""
        hw, placement = plan.topology.hardware, plan.placement
        return cls(model=plan.model.config, workload=plan.workload, algorithm=plan.algorithm,
                   sampling=plan.sampling,
                   hardware=hw if cost is None else replace(hw, cost=cost),
                   placement=PlacementConfig(mode=placement.mode,
                                             rollout_fraction=placement.rollout_fraction,
                                             max_staleness=placement.max_staleness))

"""`compile(cfg) -> ExecutionPlan`: the passes, chained. See the package docstring's diagram."""

from __future__ import annotations

from math import inf

from compiler.config import Config
from compiler.cost import CostEstimate, CostLayout, estimate
from compiler.errors import PlanError
from compiler.params import param_count
from compiler.passes.batching import batch
from compiler.passes.memory import dtype_bytes
from compiler.passes.partition import candidate_placements, partition, resolve_placement
from compiler.passes.schedule import schedule
from compiler.passes.sharding import FSDP, TENSOR, shard
from compiler.passes.topology import resolve_topology
from compiler.passes.transfer import transfer
from compiler.passes.validate import validate
from compiler.plan import (
    DetectedTopology,
    ExecutionPlan,
    ModelSummary,
    Partitions,
    PlacementSummary,
    Sharding,
    Topology,
    TransferPlan,
)


def compile(cfg: Config, detected: DetectedTopology | None = None) -> ExecutionPlan:
    """The execution plan of `cfg`, or a `PlanError` naming the key and rule it breaks."""
    topo = resolve_topology(cfg, detected)
    if cfg.placement.mode == "auto":
        return _cheapest(cfg, topo, candidate_placements(cfg, topo))
    return compile_placement(cfg, topo, resolve_placement(cfg))


def compile_placement(cfg: Config, topo: Topology, placement: PlacementSummary) -> ExecutionPlan:
    """The plan of one resolved placement on a resolved machine."""
    parts = partition(placement, topo)
    sharding = shard(cfg, topo, parts)
    batch_plan = batch(cfg, topo, parts, sharding)
    transfer_plan = transfer(cfg, topo, parts, sharding)
    steps = schedule(cfg, placement)
    cost = _estimate_cost(cfg, topo, parts, sharding, transfer_plan)
    count = param_count(cfg.model)
    return validate(ExecutionPlan(
        topology=topo, placement=placement, controller=cfg.controller,
        model=ModelSummary(cfg.model, count, count * dtype_bytes(cfg.model)),
        workload=cfg.workload, algorithm=cfg.algorithm, sampling=cfg.sampling, run=cfg.run,
        partitions=parts, sharding=sharding, batch=batch_plan, transfer=transfer_plan,
        schedule=steps, cost=cost))


def predicted_step_s(plan: ExecutionPlan) -> float:
    """The cost model's step time for the plan's own mode (inf when it cannot run)."""
    if plan.cost is None:
        return inf
    mode = (plan.cost.single if plan.controller.kind == "single"
            else plan.cost.da if plan.placement.mode == "disaggregated" else plan.cost.co)
    return mode.step_s if mode.feasible else inf


def _cheapest(cfg: Config, topo: Topology,
              candidates: tuple[PlacementSummary, ...]) -> ExecutionPlan:
    """The fastest predicted plan among the candidates (the first on ties: CO)."""
    plans, errors = [], []
    for placement in candidates:
        try:
            plans.append(compile_placement(cfg, topo, placement))
        except PlanError as err:
            errors.append(err)
    if not plans:
        raise errors[0]
    return min(plans, key=predicted_step_s)


def _estimate_cost(cfg: Config, topo: Topology, parts: Partitions, sharding: Sharding,
                   transfer_plan: TransferPlan) -> CostEstimate:
    """The cost model's estimate of CO, DA and the single controller for this layout."""
    layout = CostLayout(
        hosts=topo.hosts, devices_per_host=topo.devices_per_host, chips=topo.chips,
        rollout_hosts=len(parts.rollout_hosts), trainer_hosts=len(parts.trainer_hosts),
        fsdp_devices=sharding.train.mesh[FSDP], data_replicas=sharding.data_replicas,
        rollout_tensor_parallel=sharding.rollout.mesh[TENSOR],
        transfer_round_bytes=tuple(float(b) for b in transfer_plan.round_bytes),
        transfer_link=transfer_plan.link)
    return estimate(cfg, layout)

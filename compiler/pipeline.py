"""`compile_plan(cfg) -> ExecutionPlan`: the passes, chained. See the package docstring's diagram.

Each pass takes the config sections it reads and the earlier passes' typed outputs (the cost
estimate reads its sections through `compiler.cost.inputs.CostInputs`, which a `Config` is).
The range check runs once and the parameter table is built once per compile, the token
lengths once per placement, and handed down.
"""

from __future__ import annotations

from dataclasses import replace
from math import inf

from compiler.config import Config, PlacementMode
from compiler.cost.estimate import cost_layout, estimate
from compiler.cost.memory import dtype_bytes
from compiler.errors import PlanError
from compiler.model_entry import checkpoint_model, with_compute_dtype
from compiler.params import ParamInfo, adapter_table, param_table
from compiler.passes.batching import batch
from compiler.passes.lengths import lengths
from compiler.passes.partition import (
    candidate_placements,
    check_lora_warmup,
    check_stale_correction,
    partition,
    resolve_placement,
)
from compiler.passes.ranges import ranges
from compiler.passes.schedule import schedule
from compiler.passes.sharding import shard
from compiler.passes.topology import (
    FIT_MAX_CHIPS,
    FIT_MIN_HOSTS,
    fit_chip_counts,
    fits_by_memory,
    resolve_topology,
)
from compiler.passes.transfer import transfer
from compiler.passes.validate import validate
from compiler.plan import (
    ChipSource,
    CostEstimate,
    DetectedTopology,
    ExecutionPlan,
    ModelSummary,
    Partitions,
    PlacementCandidate,
    PlacementSummary,
    Sharding,
    Topology,
    TransferPlan,
)


def compile_plan(cfg: Config, detected: DetectedTopology | None = None) -> ExecutionPlan:
    """The execution plan of `cfg`, or a `PlanError` naming the key and rule it breaks."""
    cfg = replace(cfg, model=with_compute_dtype(checkpoint_model(cfg.model),
                                                cfg.hardware.platform),
                  algorithm=cfg.algorithm.with_rates())
    ranges(cfg)
    table = param_table(cfg.model)
    if fits_by_memory(cfg.mesh):
        return _smallest(cfg, table, FIT_MIN_HOSTS)
    return _compile_on(cfg, table, detected)


def compile_smallest(cfg: Config, min_hosts: int = FIT_MIN_HOSTS) -> ExecutionPlan:
    """The plan on the fewest chips (>= `min_hosts` hosts, a valid slice) that compiles."""
    cfg = replace(cfg, model=with_compute_dtype(cfg.model, cfg.hardware.platform),
                  algorithm=cfg.algorithm.with_rates())
    ranges(cfg)
    return _smallest(cfg, param_table(cfg.model), min_hosts)


def _smallest(cfg: Config, table: tuple[ParamInfo, ...], min_hosts: int) -> ExecutionPlan:
    last: PlanError | None = None
    for chips in fit_chip_counts(cfg.model, cfg.hardware, cfg.algorithm, min_hosts):
        try:
            plan = _compile_on(replace(cfg, mesh=replace(cfg.mesh, chips=chips)), table, None)
        except PlanError as err:
            last = err
            continue
        return replace(plan, topology=replace(plan.topology, chips_from=ChipSource.memory_fit))
    raise PlanError("mesh.chips", cfg.mesh.chips,
                    f"no {cfg.hardware.name} machine of >= {min_hosts} hosts up to "
                    f"{FIT_MAX_CHIPS} chips compiles; the last try said: {last}", "memory_fit")


def _compile_on(cfg: Config, table: tuple[ParamInfo, ...],
                detected: DetectedTopology | None) -> ExecutionPlan:
    topo = resolve_topology(cfg.mesh, cfg.hardware, detected)
    if cfg.placement.mode == PlacementMode.auto:
        candidates = candidate_placements(cfg.placement, cfg.controller, topo)
        return _cheapest(cfg, table, topo, candidates)
    return compile_placement(cfg, table, topo, resolve_placement(cfg.placement, cfg.controller))


def compile_placement(cfg: Config, table: tuple[ParamInfo, ...], topo: Topology,
                      placement: PlacementSummary) -> ExecutionPlan:
    """The plan of one resolved placement on a resolved machine (`table`: the model's)."""
    check_stale_correction(cfg.algorithm, placement)
    check_lora_warmup(cfg.algorithm, placement)
    lens = lengths(cfg.workload, cfg.sampling)
    parts = partition(placement, topo)
    sharding = shard(cfg.model, table, cfg.algorithm, cfg.mesh, lens, topo, parts)
    batch_plan = batch(cfg.workload, cfg.sampling, cfg.algorithm, cfg.model, cfg.mesh, table,
                       lens, topo, parts, sharding)
    transfer_plan = transfer(cfg.model, table, topo, parts, sharding,
                             adapter_table(cfg.model, cfg.algorithm.lora))
    steps = schedule(cfg.controller, placement)
    cost = _estimate_cost(cfg, topo, parts, sharding, transfer_plan)
    count = sum(p.size for p in table)
    adapters = sum(p.size for p in adapter_table(cfg.model, cfg.algorithm.lora))
    return validate(ExecutionPlan(
        topology=topo, placement=placement, controller=cfg.controller,
        model=ModelSummary(cfg.model, count, count * dtype_bytes(cfg.model),
                           adapters or count, adapters * dtype_bytes(cfg.model)),
        workload=cfg.workload, algorithm=cfg.algorithm, sampling=cfg.sampling, run=cfg.run,
        partitions=parts, sharding=sharding, batch=batch_plan, transfer=transfer_plan,
        schedule=steps, cost=cost), table)


def predicted_step_s(plan: ExecutionPlan) -> float:
    """The cost model's step time for the plan's own mode (inf when it cannot run)."""
    mode = plan.own_cost
    return mode.step_s if mode is not None and mode.feasible else inf


def _cheapest(cfg: Config, table: tuple[ParamInfo, ...], topo: Topology,
              candidates: tuple[PlacementSummary, ...]) -> ExecutionPlan:
    """The fastest predicted plan among the candidates (the first on ties: CO), with the ranking."""
    plans, rejected, errors = [], [], []
    for placement in candidates:
        try:
            plans.append(compile_placement(cfg, table, topo, placement))
        except PlanError as err:
            errors.append(err)
            rejected.append(_candidate(placement, 0.0, False, f"does not compile: {err}"))
    if not plans:
        raise errors[0]
    ranked = sorted(plans, key=predicted_step_s)  # stable: CO stays first on ties
    best, best_s = ranked[0], predicted_step_s(ranked[0])
    ranking = [_candidate(best.placement, best_s, True, "fastest predicted step")]
    for plan in ranked[1:]:
        step = predicted_step_s(plan)
        why = (f"cannot run: {getattr(plan.own_cost, 'note', 'no cost')}" if step == inf
               else f"{step / best_s:.2f}x the chosen step ({step - best_s:+.3g} s)")
        ranking.append(_candidate(plan.placement, 0.0 if step == inf else step, False, why))
    return replace(best, placement_candidates=tuple(ranking + rejected))


def _candidate(placement: PlacementSummary, step_s: float, chosen: bool,
               reason: str) -> PlacementCandidate:
    co = placement.mode == PlacementMode.colocated
    return PlacementCandidate(placement.mode, 1.0 if co else placement.rollout_fraction,
                              step_s, chosen, reason)


def _estimate_cost(cfg: Config, topo: Topology, parts: Partitions, sharding: Sharding,
                   transfer_plan: TransferPlan) -> CostEstimate:
    """The cost model's estimate of CO, DA and the single controller for this layout."""
    return estimate(cfg, cost_layout(topo, parts, sharding, transfer_plan))

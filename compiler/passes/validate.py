"""Last pass: check the plan's own invariants. A failure is a compiler bug, never user error."""

from __future__ import annotations

from collections import Counter

from compiler.config import PlacementMode
from compiler.errors import PlanInvariantError
from compiler.params import ParamInfo, adapter_table
from compiler.plan import ExecutionPlan, RoleSharding


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise PlanInvariantError(what)


def _partitions(plan: ExecutionPlan) -> None:
    parts, topo = plan.partitions, plan.topology
    everyone = set(range(topo.hosts))
    rollout, trainer = set(parts.rollout_hosts), set(parts.trainer_hosts)
    _check(len(rollout) == len(parts.rollout_hosts) and len(trainer) == len(parts.trainer_hosts),
           "a host is listed twice in one role")
    if plan.placement.mode == PlacementMode.disaggregated:
        _check(not rollout & trainer and rollout | trainer == everyone,
               "DA roles must partition the hosts")
        _check(parts.rollout_devices + parts.trainer_devices == topo.devices,
               "DA roles must hold each device once")
    else:
        _check(rollout == trainer == everyone, "CO: every host has both roles")


def _specs(table: tuple[ParamInfo, ...], role: RoleSharding) -> None:
    for p in table:
        spec = role.specs[p.name]
        _check(len(spec) == len(p.shape), f"{p.name}: spec rank differs from shape")
        for dim, axis in zip(p.shape, spec, strict=True):
            _check(axis is None or dim % role.mesh[axis] == 0, f"{p.name}: {axis} does not divide")


def _batch(plan: ExecutionPlan) -> None:
    b = plan.batch
    covered = [i for r in b.prompt_ranges for i in range(r.start, r.stop)]
    _check(sorted(covered) == list(range(b.prompts_per_step)), "prompts not covered exactly once")
    _check(tuple(r.host for r in b.prompt_ranges) == plan.partitions.rollout_hosts,
           "one prompt range per rollout host")
    _check(b.rows_per_trainer_device * plan.partitions.trainer_devices == b.sequences_per_step,
           "train rows do not cover the sequences")


def _transfer(plan: ExecutionPlan, table: tuple[ParamInfo, ...]) -> None:
    t, parts = plan.transfer, plan.partitions
    if plan.placement.mode == PlacementMode.disaggregated:  # LoRA: DA sends the adapters
        table = adapter_table(plan.model.config, plan.algorithm.lora) or table
    rows = Counter()
    for sl in t.slices:
        for piece in sl.pieces:
            rows[piece.name] += piece.stop - piece.start
    _check(rows == Counter({p.name: p.shape[0] for p in table}),
           "slices must cover every parameter row once")
    got = Counter()
    for sends in t.rounds:
        _check(len({s.src for s in sends}) == len(sends), "a host sends twice in a round")
        _check(len({s.dst for s in sends}) == len(sends), "a host receives twice in a round")
        got.update((s.dst, s.slice) for s in sends)
    want = Counter((h, sl.index) for h in parts.rollout_hosts for sl in t.slices)
    _check(got == want, "each rollout host must receive each slice exactly once")
    if plan.placement.mode == PlacementMode.disaggregated:
        trainers = set(parts.trainer_hosts)
        _check(all(s.src in trainers for r in t.rounds for s in r), "DA senders are trainers")


def validate(plan: ExecutionPlan, table: tuple[ParamInfo, ...]) -> ExecutionPlan:
    """The plan, unchanged, once its invariants hold (`table`: its model's parameters)."""
    _partitions(plan)
    _specs(table, plan.sharding.train)
    _specs(table, plan.sharding.rollout)
    _batch(plan)
    _transfer(plan, table)
    return plan

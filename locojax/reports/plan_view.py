"""Readable summary of a typed plan as rich tables (`locojax-plan`, `run.plan_only=true`)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from rich.console import Console
from rich.table import Table

from compiler.axes import MeshAxis
from compiler.plan import COST_MODES, BatchPlan, ExecutionPlan, RoleSharding, StepSchedule
from compiler.sections import AlgorithmConfig
from locojax.runtime.observe.progress import uncut_console

SAMPLE_PARAMS = 6
SAMPLE_ROUNDS = 4


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_count(n: float) -> str:
    """596049920 -> '0.60B', 398080 -> '0.398M'."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def is_byte_count(name: str) -> bool:
    """Whether a plan field holds bytes (`kv_bytes_per_sequence`, `train_step_bytes_per_device`)."""
    return "bytes" in name.split("_")


def host_ranges(hosts: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out: list[str] = []
    for h in sorted(hosts):
        if out and int(out[-1].split("-")[-1]) == h - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{h}"
        else:
            out.append(str(h))
    return ", ".join(out)


def _kv_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, str(value))
    return table


def _roles(plan: ExecutionPlan) -> Table:
    parts, topo = plan.partitions, plan.topology
    rollout, trainer = set(parts.rollout_hosts), set(parts.trainer_hosts)
    table = Table(title="Hosts and roles", title_justify="left")
    for col in ("role", "hosts", "count", "devices"):
        table.add_column(col)
    both = sorted(rollout & trainer)
    groups = [("rollout + train", both)] if both else []
    groups += [("rollout", sorted(rollout - trainer)), ("train", sorted(trainer - rollout))]
    for role, hosts in groups:
        if hosts:
            devices = len(hosts) * topo.devices_per_host
            table.add_row(role, host_ranges(hosts), str(len(hosts)), str(devices))
    return table


def _layouts(plan: ExecutionPlan) -> dict[str, RoleSharding]:
    """The plan's role layouts by role name (`train`, `rollout`), in plan order."""
    return {f.name: getattr(plan.sharding, f.name) for f in fields(plan.sharding)
            if isinstance(getattr(plan.sharding, f.name), RoleSharding)}


def _meshes(plan: ExecutionPlan) -> Table:
    table = Table(title="Meshes", title_justify="left")
    for col in ("role", "axes", "rules (logical -> mesh)"):
        table.add_column(col)
    for role, layout in _layouts(plan).items():
        axes = " x ".join(f"{k}={v}" for k, v in layout.mesh.items())
        rules = ", ".join(f"{k}->{[str(a) for a in v]}" for k, v in layout.rules.items() if v)
        table.add_row(role, axes, rules)
    return table


def _spec(spec: tuple[MeshAxis | None, ...] | None) -> str:
    if spec is None:
        return "replicated"
    return "(" + ", ".join("None" if s is None else str(s) for s in spec) + ")"


def _sharding_sample(plan: ExecutionPlan) -> Table:
    layouts = _layouts(plan)
    names = list(next(iter(layouts.values())).specs) if layouts else []
    table = Table(title=f"Sharding (first {SAMPLE_PARAMS} of {len(names)} parameters)",
                  title_justify="left")
    table.add_column("parameter")
    for role in layouts:
        table.add_column(f"{role} spec")
    for name in names[:SAMPLE_PARAMS]:
        table.add_row(name, *(_spec(lay.specs.get(name)) for lay in layouts.values()))
    return table


def _batch_rows(batch: BatchPlan) -> list[tuple[str, Any]]:
    """The batch plan's numbers (not its per-host ranges), byte counts made readable."""
    rows = []
    for f in fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, tuple):
            continue
        rows.append((f.name, human_bytes(value) if is_byte_count(f.name) else value))
    return rows


def _transfer(plan: ExecutionPlan) -> Table:
    rounds = plan.transfer.rounds
    total = sum(m.bytes for rnd in rounds for m in rnd)
    table = Table(title=f"Weight transfer: {len(rounds)} rounds, {human_bytes(total)} per update",
                  title_justify="left")
    for col in ("round", "messages", "bytes", "example"):
        table.add_column(col)
    for i, rnd in enumerate(rounds[:SAMPLE_ROUNDS]):
        ex = rnd[0] if rnd else None
        example = f"{ex.src} -> {ex.dst}: {len(ex.params)} params" if ex else "-"
        table.add_row(str(i), str(len(rnd)), human_bytes(sum(m.bytes for m in rnd)), example)
    if len(rounds) > SAMPLE_ROUNDS:
        table.add_row("...", "", "", "")
    return table


def _schedule_rows(schedule: StepSchedule) -> list[tuple[str, str]]:
    phases = " -> ".join(
        f"{p.phase}@{p.where}" + (" (global)" if p.global_step else "") for p in schedule.phases
    )
    overlaps = "; ".join(
        f"{o.ahead} of step t+{o.steps_ahead} overlaps {o.behind} of step t"
        for o in schedule.overlaps
    )
    return [("phases", phases), ("overlaps", overlaps or "none (phases run in sequence)")]


COST_COLUMNS = ("step_s", "rollout_s", "reward_s", "train_s", "compute_s", "host_s", "network_s",
                "exposed_transfer_s")


def _cost(plan: ExecutionPlan) -> Table | None:
    if plan.cost is None:
        return None
    table = Table(title="Cost estimate (seconds per step)", title_justify="left")
    table.add_column("mode")
    for col in COST_COLUMNS:
        table.add_column(col.removesuffix("_s"))
    costs = {mode: getattr(plan.cost, mode) for mode in COST_MODES}
    if any(not cost.feasible for cost in costs.values()):
        table.add_column("why not")
    for mode, cost in costs.items():
        if cost.feasible:
            numbers = [f"{getattr(cost, c):.3g}" for c in COST_COLUMNS]
            table.add_row(mode, *numbers, *([""] if len(table.columns) > len(numbers) + 1
                                           else []))
        else:  # a mode this machine cannot run: no numbers, the reason instead
            table.add_row(mode, *["-"] * len(COST_COLUMNS), cost.note or "cannot run here")
    return table


def _placement_ranking(plan: ExecutionPlan) -> Table | None:
    if not plan.placement_candidates:
        return None
    table = Table(title="placement=auto: candidates, fastest first", title_justify="left")
    for col in ("", "placement", "rollout fraction", "step s", "why"):
        table.add_column(col)
    for c in plan.placement_candidates:
        table.add_row("*" if c.chosen else "", str(c.mode), f"{c.rollout_fraction:.2f}",
                      f"{c.step_s:.3g}" if c.step_s else "-", c.reason)
    return table


def objective_line(algorithm: AlgorithmConfig) -> str:
    """The loss the plan trains with: policy loss, ratio level, clip range, aggregation, dual
    clip and the rollout correction (the values ratio_level=sequence chose when the user set
    none)."""
    a = algorithm
    parts = [f"lr {a.rl_learning_rate:g}" + (" (adapters)" if a.lora.rank else ""),
             str(a.loss), f"ratio per {a.ratio_level}",
             f"clip [1-{a.clip_eps:g}, 1+{a.clip_eps_high:g}]", str(a.loss_aggregation),
             f"{a.optimizer_steps_per_batch} updates per batch"]
    if a.dual_clip:
        parts.append(f"dual clip {a.dual_clip:g}")
    parts.append(f"rollout correction {a.rollout_correction}"
                 + (f" (cap {a.rollout_correction_cap:g})" if a.rollout_logp else ""))
    if a.kl_coef:
        parts.append(f"kl {a.kl_coef:g}")
    return ", ".join(parts)


def print_plan(plan: ExecutionPlan, console: Console | None = None) -> None:
    """Print the summary tables of `plan`."""
    console = console or uncut_console(stderr=False)
    topo, model = plan.topology, plan.model
    console.print(_kv_table("Plan", [
        ("model", f"{model.config.name} ({human_count(model.param_count)} params, "
                  f"{model.config.dtype} compute)"),
        ("workload", plan.workload.name),
        ("placement", plan.placement.mode),
        ("controller", plan.controller.kind),
        ("objective", objective_line(plan.algorithm)),
        ("accelerator", f"{topo.accelerator}: {topo.chips} chips, {topo.hosts} hosts x "
                        f"{topo.devices_per_host} devices"),
    ]))
    console.print(_roles(plan))
    console.print(_meshes(plan))
    console.print(_sharding_sample(plan))
    console.print(_kv_table("Batch", _batch_rows(plan.batch)))
    console.print(_transfer(plan))
    console.print(_kv_table("Step schedule", _schedule_rows(plan.schedule)))
    for table in (_cost(plan), _placement_ranking(plan)):
        if table is not None:
            console.print(table)

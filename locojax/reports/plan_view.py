"""Readable summary of a plan (its JSON dict) as rich tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

SAMPLE_PARAMS = 6
SAMPLE_ROUNDS = 4


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


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


def _roles(plan: dict[str, Any]) -> Table:
    parts, topo = plan["partitions"], plan["topology"]
    rollout, trainer = set(parts["rollout_hosts"]), set(parts["trainer_hosts"])
    table = Table(title="Hosts and roles", title_justify="left")
    for col in ("role", "hosts", "count", "devices"):
        table.add_column(col)
    both = sorted(rollout & trainer)
    groups = [("rollout + train", both)] if both else []
    groups += [("rollout", sorted(rollout - trainer)), ("train", sorted(trainer - rollout))]
    for role, hosts in groups:
        if hosts:
            devices = len(hosts) * topo["devices_per_host"]
            table.add_row(role, host_ranges(hosts), str(len(hosts)), str(devices))
    return table


def _meshes(plan: dict[str, Any]) -> Table:
    table = Table(title="Meshes", title_justify="left")
    for col in ("role", "axes", "rules (logical -> mesh)"):
        table.add_column(col)
    for role, layout in plan["sharding"].items():
        if not isinstance(layout, dict) or "mesh" not in layout:
            continue
        axes = " x ".join(f"{k}={v}" for k, v in layout["mesh"].items())
        rules = ", ".join(f"{k}->{v}" for k, v in (layout.get("rules") or {}).items() if v)
        table.add_row(role, axes, rules)
    return table


def _spec(spec: Any) -> str:
    if spec is None:
        return "replicated"
    return "(" + ", ".join("None" if s is None else str(s) for s in spec) + ")"


def _sharding_sample(plan: dict[str, Any]) -> Table:
    layouts = {r: lay for r, lay in plan["sharding"].items() if isinstance(lay, dict)}
    roles = [r for r, lay in layouts.items() if "specs" in lay]
    names = list(layouts[roles[0]]["specs"]) if roles else []
    table = Table(title=f"Sharding (first {SAMPLE_PARAMS} of {len(names)} parameters)",
                  title_justify="left")
    table.add_column("parameter")
    for role in roles:
        table.add_column(f"{role} spec")
    for name in names[:SAMPLE_PARAMS]:
        table.add_row(name, *(_spec(layouts[r]["specs"].get(name)) for r in roles))
    return table


def _transfer(plan: dict[str, Any]) -> Table:
    rounds = plan["transfer"]["rounds"]
    total = sum(m["bytes"] for rnd in rounds for m in rnd)
    table = Table(title=f"Weight transfer: {len(rounds)} rounds, {human_bytes(total)} per update",
                  title_justify="left")
    for col in ("round", "messages", "bytes", "example"):
        table.add_column(col)
    for i, rnd in enumerate(rounds[:SAMPLE_ROUNDS]):
        ex = rnd[0] if rnd else None
        example = f"{ex['src']} -> {ex['dst']}: {len(ex['params'])} params" if ex else "-"
        table.add_row(str(i), str(len(rnd)), human_bytes(sum(m["bytes"] for m in rnd)), example)
    if len(rounds) > SAMPLE_ROUNDS:
        table.add_row("...", "", "", "")
    return table


def _schedule_rows(schedule: dict[str, Any]) -> list[tuple[str, str]]:
    phases = " -> ".join(
        f"{p['phase']}@{p['where']}" + (" (global)" if p["global_step"] else "")
        for p in schedule["phases"]
    )
    overlaps = "; ".join(
        f"{o['ahead']} of step t+{o['steps_ahead']} overlaps {o['behind']} of step t"
        for o in schedule["overlaps"]
    )
    return [("phases", phases), ("overlaps", overlaps or "none (phases run in sequence)")]


def _cost(plan: dict[str, Any]) -> Table | None:
    cost = plan.get("cost")
    if not cost:
        return None
    cols = ("step_s", "rollout_s", "reward_s", "train_s", "compute_s", "host_s", "network_s",
            "exposed_transfer_s")
    table = Table(title="Cost estimate (seconds per step)", title_justify="left")
    table.add_column("mode")
    for col in cols:
        table.add_column(col.removesuffix("_s"))
    for mode in ("co", "da", "single"):
        if isinstance(cost.get(mode), dict):
            table.add_row(mode, *(f"{cost[mode].get(c, 0.0):.3g}" for c in cols))
    return table


def _placement_ranking(plan: dict[str, Any]) -> Table | None:
    candidates = plan.get("placement_candidates") or []
    if not candidates:
        return None
    table = Table(title="placement=auto: candidates, fastest first", title_justify="left")
    for col in ("", "placement", "rollout fraction", "step s", "why"):
        table.add_column(col)
    for c in candidates:
        table.add_row("*" if c["chosen"] else "", c["mode"], f"{c['rollout_fraction']:.2f}",
                      f"{c['step_s']:.3g}" if c["step_s"] else "-", c["reason"])
    return table


def print_plan(plan: dict[str, Any], console: Console | None = None) -> None:
    """Print the summary tables of `plan` (the dict form of its JSON)."""
    console = console or Console()
    topo, batch = plan["topology"], plan["batch"]
    model = plan.get("model", {})
    console.print(_kv_table("Plan", [
        ("model", f"{model['config']['name']} ({model['param_count'] / 1e9:.2f}B params)"),
        ("workload", plan.get("workload", {}).get("name", "?")),
        ("placement", plan.get("placement", {}).get("mode", "?")),
        ("controller", plan.get("controller", {}).get("kind", "?")),
        ("accelerator", f"{topo['accelerator']}: {topo['chips']} chips, {topo['hosts']} hosts x "
                        f"{topo['devices_per_host']} devices"),
    ]))
    console.print(_roles(plan))
    console.print(_meshes(plan))
    console.print(_sharding_sample(plan))
    console.print(_kv_table("Batch", [
        (k, human_bytes(v) if k.endswith("bytes_per_row") or k.endswith("bytes_per_sequence")
         else v)
        for k, v in batch.items() if not isinstance(v, list | dict)
    ]))
    console.print(_transfer(plan))
    console.print(_kv_table("Step schedule", _schedule_rows(plan["schedule"])))
    for table in (_cost(plan), _placement_ranking(plan)):
        if table is not None:
            console.print(table)

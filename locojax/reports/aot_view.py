"""The TPU compiler's report on a plan (`locojax-plan ... aot=true`): rich tables, or the
`aot` key of `format=json`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from compiler.cost.roofline import compiled_cost
from compiler.plan import ExecutionPlan
from locojax.reports.plan_view import human_bytes

if TYPE_CHECKING:  # a type only: importing locojax.aot loads JAX and the runtime
    from locojax.aot.target import AotReport

MEASURES = {"train_efficiency": "train step: plan FLOPs / compiled matmul FLOPs",
            "decode_efficiency": "slot loop: ideal bytes / compiled bytes accessed"}
"""What each efficiency taken from the compiled programs is (`compiler.cost.roofline`)."""

MEMORY_COLUMNS = (("args", "argument_bytes"), ("out", "output_bytes"),
                  ("alias", "alias_bytes"), ("temp", "temp_bytes"),
                  ("peak", "compiler_bytes"), ("plan", "plan_bytes"))
"""Per-device byte columns of the memory table (GiB): (header, report field)."""
JSON_FIELDS = ("compiler_bytes", "plan_bytes", "ratio", "flops", "plan_flops", "flops_note",
               "argument_bytes", "output_bytes", "alias_bytes", "temp_bytes",
               "plan_network_bytes", "compile_s")
"""Fields of each program under `aot.programs` (and `collectives`)."""
GIB = 1024**3


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def _memory(report: AotReport) -> Table:
    target = report.target
    table = Table(title=f"TPU compiler: {target.topology_name} ({target.accelerator_type}, "
                        f"{target.hosts} host{'s' if target.hosts != 1 else ''}, "
                        f"{target.devices} devices of "
                        f"{_gib(target.device_hbm_bytes)} GiB): GiB per device",
                  title_justify="left")
    table.add_column("program", no_wrap=True)
    for header, _ in MEMORY_COLUMNS:
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("plan/peak", justify="right", no_wrap=True)
    for p in report.programs:
        table.add_row(p["name"], *(_gib(p[field]) for _, field in MEMORY_COLUMNS),
                      f"{p['ratio']:.2f}")
    return table


def _work(report: AotReport) -> Table:
    table = Table(title="Per device: FLOPs (compiler, plan), network bytes (plan)",
                  title_justify="left")
    table.add_column("program", no_wrap=True)
    for col in ("FLOPs", "plan FLOPs", "plan network", "compile s"):
        table.add_column(col, justify="right", no_wrap=True)
    for p in report.programs:
        table.add_row(p["name"], f"{p['flops']:.3g}", f"{p['plan_flops']:.3g}",
                      human_bytes(p["plan_network_bytes"]), f"{p['compile_s']:.1f}")
    return table


def _collectives(report: AotReport) -> Table:
    table = Table(title="Collectives in the optimised HLO (per device)", title_justify="left")
    for col in ("program", "collective", "count", "bytes", "received"):
        table.add_column(col, no_wrap=True, justify="left" if col in ("program", "collective")
                         else "right")
    for p in report.programs:
        for c in p.get("collectives", ()) or ({"kind": "none", "count": 0, "bytes": 0},):
            table.add_row(p["name"], c["kind"], str(c["count"]), human_bytes(c["bytes"]),
                          human_bytes(c.get("received_bytes", 0)))
    return table


def _efficiency_lines(report: AotReport, plan: ExecutionPlan) -> list[str]:
    """The efficiencies the plan's cost section took from its compiled programs."""
    compiled, entry = compiled_cost(plan, report.programs), plan.topology.hardware
    lines = [f"{k} {v:.3f} ({MEASURES[k]}; conf/hardware/{entry.name}.yaml: "
             f"{getattr(entry.cost, k):.2f}){', capped at 1' if k in compiled.capped else ''}"
             for k, v in compiled.fractions.items()]
    if not lines:
        return []
    return ["the plan's step times (cost section) use this plan's compiled programs: "
            + "; ".join(lines)]


def print_aot(report: AotReport, plan: ExecutionPlan, console: Console | None = None) -> None:
    """Print the compiler's memory, FLOPs and collectives beside the plan's, and the
    efficiencies `plan`'s cost section took from the compiled programs."""
    console = console or Console()
    console.print(_memory(report))
    console.print(_work(report))
    console.print(_collectives(report))
    for line in _efficiency_lines(report, plan):
        console.print(line)
    for note in sorted({p["flops_note"] for p in report.programs if p.get("flops_note")}):
        console.print(f"FLOPs (compiler): {note}")
    if report.chips_tried:
        console.print(f"mesh.chips=0: the TPU compiler refused "
                      f"{', '.join(map(str, report.chips_tried))} chips")
    console.print(f"compiled in {report.wall_s:.0f} s wall, {report.cpu_s:.0f} CPU-s, peak RSS "
                  f"{human_bytes(report.peak_rss_bytes)}")


def aot_json(report: AotReport, plan: ExecutionPlan) -> dict[str, Any]:
    """The `aot` key of `format=json`; `efficiencies`: what `plan`'s cost section took from
    the compiled programs (before capping at 1)."""
    target = report.target
    programs = {p["name"]: {**{f: p[f] for f in JSON_FIELDS if f in p},
                            "collectives": list(p.get("collectives", ()))}
                for p in report.programs}
    return {"target": target.topology_name, "accelerator_type": target.accelerator_type,
            "hosts": target.hosts, "devices": target.devices,
            "device_hbm_bytes": target.device_hbm_bytes, "programs": programs,
            "chips_tried": list(report.chips_tried), "wall_s": report.wall_s,
            "cpu_s": report.cpu_s, "peak_rss_bytes": report.peak_rss_bytes,
            "efficiencies": dict(compiled_cost(plan, report.programs).fractions)}

"""The paper's programs as the TPU compiler sees them: plan vs compiler, per program and slice.

    .venv/bin/python benchmarks/aot.py [--cases gsm8k-v5e-8,numina-v7x-0] [--quick | --smoke]
        [--timeout-s 3600] [--list]

Needs the `tpu` extra (libtpu: the TPU compiler, no TPU). Each case composes an experiment
(`+experiment=gsm8k_co`: Qwen3-0.6B, all 28 layers, 384 prompts x 8, 256 + 768 tokens;
`+experiment=numina_co`: 512 + 2,048 tokens) on a slice (`mesh=v5e|v5p|v6e|v7x`,
`mesh.chips`: 0 = the chip count the plan picks, 8, 64; Qwen3-1.7B and 4B on v7x too),
compiles the plan, then compiles its programs for the slice, each group in its own child
process (`locojax.aot.target.run_child`, the `locojax-plan ... aot=true` path): the train
step; the rollout's prefill and slot loop; CO's reshard where the plan has one. Per program
it prints the plan's and the compiler's bytes per device, whether it fits, the child's wall,
CPU seconds and peak RSS (a compile past 10 CPU-minutes is flagged, one past `--timeout-s`
wall seconds is killed and reported), the collectives' bytes beside the plan's network
bytes, and the efficiency ceiling the compiled program allows:

- train step: the cost model's FLOPs (3 x forward: 6 x params x tokens + attention) over
  the compiler's matmul FLOPs (loop bodies multiplied out); remat's recompute shows here;
- slot loop (one decode step): the ideal bytes (the rollout weights once + the live KV of
  every slot at the mean context, prompt + response / 2) over the compiler's `bytes
  accessed` of the loop, whose body it counts once (a refill + one decode step; with a
  chunked prompt store, the prefill branch too).

`--quick`: one cheap case (Qwen3-0.6B widths, 2 layers, a small batch, 4 v5e chips);
`--smoke`: the same at the tiny model's widths (the test suite's: the script's plumbing, not
its figures). The last line is JSON: {"cases": {case: {"overrides", "status", "topology",
"hardware", "chips", "programs": {program: {...}}}}, "fits": {hardware: {"train_efficiency",
"decode_efficiency"}} (each fitted over the cases run: `compiler.cost.roofline.fitted`),
"not_run": [cases not selected]}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # this process never loads libtpu

from compiler import PlanError, compile_plan  # noqa: E402
from compiler.cost.roofline import CONSTANT_OF, ceiling, fitted  # noqa: E402
from compiler.hardware import tpu_slice  # noqa: E402
from compiler.plan import ExecutionPlan  # noqa: E402
from locojax.aot.programs import reshard_is_a_program  # noqa: E402
from locojax.aot.target import run_child, tpu_compiler_installed  # noqa: E402
from locojax.config.compose import compose_config  # noqa: E402

GIB = 1024**3
CPU_LIMIT_S = 600.0
"""A compile past this many CPU seconds is flagged in the table and the JSON."""
EXPERIMENTS = {"gsm8k": "+experiment=gsm8k_co", "numina": "+experiment=numina_co"}
HARDWARE = ("v5e", "v6e", "v5p", "v7x")
CHIPS = (8, 0, 64)
QUICK = {"quick-v5e-4-2layers": [
    "+experiment=gsm8k_co", "model.num_layers=2", "workload.prompts_per_step=4",
    "workload.group_size=2", "workload.max_prompt_len=64", "workload.max_response_len=64",
    "mesh=v5e", "mesh.chips=4"]}
"""The quick case: Qwen3-0.6B widths, 2 layers, 4 prompts x 2, 64 + 64 tokens, v5e:2x2."""
SMOKE = {"smoke-v5e-4-tiny": [*QUICK["quick-v5e-4-2layers"], "model=tiny"]}
"""The quick case at the tiny model's widths (hidden 256, 4 layers): compiles in seconds."""
GROUPS = (("train_step",), ("rollout_prefill", "rollout_slots"), ("reshard",))
"""Programs compiled together in one child process."""


def all_cases() -> dict[str, list[str]]:
    """Case name -> overrides, in the order they run: GSM8K at 8 chips on every generation,
    then the plan's own chip count, then 64; NuminaMath; the larger models on v7x."""
    cases = {}
    for exp, chips, hw in ((e, c, h) for e in EXPERIMENTS for c in CHIPS for h in HARDWARE):
        cases[f"{exp}-{hw}-{chips}"] = [EXPERIMENTS[exp], f"mesh={hw}", f"mesh.chips={chips}"]
    for model in ("qwen3_1_7b", "qwen3_4b"):
        for chips in (0, 8):
            cases[f"gsm8k-v7x-{chips}-{model}"] = [EXPERIMENTS["gsm8k"], f"model={model}",
                                                   "mesh=v7x", f"mesh.chips={chips}"]
    return cases


def _child_figures(run, hbm: float) -> dict[str, Any]:
    return {"compile_wall_s": round(run.wall_s, 1), "compile_cpu_s": round(run.cpu_s, 1),
            "peak_rss_bytes": run.peak_rss_bytes, "over_10_cpu_min": run.cpu_s > CPU_LIMIT_S,
            "device_hbm_bytes": hbm}


def _program_row(plan: ExecutionPlan, p: dict[str, Any], run, hbm: float) -> dict[str, Any]:
    moved = sum(c["bytes"] for c in p.get("collectives", ()))
    return {"plan_bytes": p["plan_bytes"], "compiler_bytes": p["compiler_bytes"],
            "ratio": round(p["ratio"], 3), "fits": p["compiler_bytes"] <= hbm,
            "argument_bytes": p["argument_bytes"], "temp_bytes": p["temp_bytes"],
            "flops": p["flops"], "plan_flops": p["plan_flops"],
            "bytes_accessed": p.get("bytes_accessed", 0.0),
            "collective_bytes": moved, "collectives": p.get("collectives", []),
            "collective_received_bytes": sum(c.get("received_bytes", 0)
                                             for c in p.get("collectives", ())),
            "plan_network_bytes": p["plan_network_bytes"], "ceiling": ceiling(plan, p),
            "program_compile_s": round(p["compile_s"], 1), **_child_figures(run, hbm)}


def run_group(plan: ExecutionPlan, group: tuple[str, ...], timeout_s: float
              ) -> dict[str, dict[str, Any]]:
    """program -> its figures, compiled in one child process (or why it has none)."""
    topo = plan.topology
    target = tpu_slice(topo.hardware, topo.chips, topo.hosts)
    run = run_child(plan, target, programs=group, timeout_s=timeout_s)
    hbm = target.device_hbm_bytes
    if run.timed_out:
        return {name: {"status": f"timed out after {run.wall_s:.0f} s wall",
                       **_child_figures(run, hbm)} for name in group}
    result = run.result or {}
    if "topology_error" in result:
        return {name: {"status": f"topology: {result['topology_error']}"} for name in group}
    if "out_of_memory" in result:
        oom = result["out_of_memory"]
        return {oom["program"]: {"status": "out of memory", "fits": False,
                                 "compiler_bytes": oom.get("needed_bytes"),
                                 "message": oom.get("message", ""), **_child_figures(run, hbm)}}
    return {p["name"]: _program_row(plan, p, run, hbm) for p in result["programs"]}


def run_case(overrides: list[str], timeout_s: float) -> dict[str, Any]:
    """The plan of `overrides` and its programs' figures."""
    try:
        plan = compile_plan(compose_config(overrides))
    except PlanError as err:
        return {"overrides": overrides, "status": f"plan refused: {err}"}
    topo = plan.topology
    target = tpu_slice(topo.hardware, topo.chips, topo.hosts)
    out = {"overrides": overrides, "status": "compiled", "topology": target.topology_name,
           "hardware": topo.hardware.name,
           "chips": topo.chips, "hosts": topo.hosts, "devices": target.devices,
           "params": plan.model.param_count, "programs": {}}
    for group in GROUPS:
        if group == ("reshard",) and not reshard_is_a_program(plan):
            continue  # several training hosts: the runtime reshards through host memory
        figures = run_group(plan, group, timeout_s)
        for name, row in figures.items():
            out["programs"][name] = row
            print_row(name, row)
    return out


def print_row(name: str, row: dict[str, Any]) -> None:
    """One program's line of the table (flushed as it is measured)."""
    def gib(key: str) -> str:
        return f"{row[key] / GIB:7.2f}" if row.get(key) is not None else "      -"

    ceil = row.get("ceiling")
    status = row.get("status", "fits" if row.get("fits") else "DOES NOT FIT")
    flag = " >10 CPU-min" if row.get("over_10_cpu_min") else ""
    print(f"  {name:<16}{gib('plan_bytes')}{gib('compiler_bytes')} "
          f"{row.get('ratio', float('nan')):5.2f}  {status:<13}"
          f"{row.get('compile_wall_s', 0):7.0f}{row.get('compile_cpu_s', 0):7.0f}"
          f"{row.get('peak_rss_bytes', 0) / GIB:6.2f}"
          f"{(row.get('collective_bytes') or 0) / GIB:9.3f}"
          f"{(row.get('plan_network_bytes') or 0) / GIB:9.3f}"
          f"  {'' if ceil is None else f'{ceil:.2f}'}{flag}", flush=True)


HEADER = ("  program           plan GiB comp GiB  p/c  status        wall s  CPU s RSS GiB"
          " coll GiB  net GiB  ceiling")


def fits(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per hardware entry, each efficiency fitted over the cases run (`roofline.fitted` of
    their ceilings): what `conf/hardware/<name>.yaml` takes from a full run."""
    ceilings: dict[str, dict[str, list[float]]] = {}
    for case in results.values():
        for program, row in case.get("programs", {}).items():
            if program in CONSTANT_OF and (row.get("ceiling") or 0) > 0:
                per = ceilings.setdefault(case["hardware"], {})
                per.setdefault(CONSTANT_OF[program], []).append(row["ceiling"])
    return {hw: {k: round(fitted(v), 4) for k, v in per.items()} for hw, per in ceilings.items()}


def _libtpu() -> str | None:
    try:
        return version("libtpu")
    except PackageNotFoundError:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--quick", action="store_true", help="the quick case only")
    parser.add_argument("--smoke", action="store_true", help="the tiny smoke case only")
    parser.add_argument("--timeout-s", type=float, default=3600.0,
                        help="wall seconds one compiling child may take before it is killed")
    parser.add_argument("--list", action="store_true", help="print the case names and exit")
    args = parser.parse_args()
    known = {**all_cases(), **QUICK, **SMOKE}
    if args.list:
        print("\n".join(known))
        return 0
    chosen = list(QUICK) if args.quick else list(SMOKE) if args.smoke else (
        [c for c in args.cases.split(",") if c] or list(all_cases()))
    unknown = [c for c in chosen if c not in known]
    if unknown:
        print(f"error: unknown cases {unknown}; --list names them", file=sys.stderr)
        return 2
    if not tpu_compiler_installed():
        print("error: the TPU compiler (libtpu) is not installed: pip install "
              "'locojax[tpu]'", file=sys.stderr)
        return 2
    results = {}
    for name in chosen:
        print(f"{name}: {' '.join(known[name])}\n{HEADER}", flush=True)
        results[name] = run_case(known[name], args.timeout_s)
        if results[name]["status"] != "compiled":
            print(f"  {results[name]['status']}", flush=True)
    print(json.dumps({"libtpu": _libtpu(), "cases": results, "fits": fits(results),
                      "not_run": [c for c in all_cases() if c not in results]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Plan compilation at scale: Llama-3 405B on 512 TPU v7x chips, per placement mode.

    .venv/bin/python benchmarks/compile.py [--repeats 5]

Composes `model=llama3_405b workload=numina_cot mesh=v7x mesh.chips=512` (rollout fraction
0.75, staleness 1), compiles it `--repeats` times per placement (colocated, disaggregated,
auto: auto compiles every candidate placement) and prints the seconds of the first compile
(the parameter tables are cached after it), the median of the later ones and the median of a
JSON round trip. No JAX, no devices. The last line is JSON: {"first_compile_s": {mode: s},
"compile_s": {mode: median s}, "round_trip_s": {mode: median s}, "hosts", "params"}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from compiler import compile_plan, plan_from_json, plan_to_json
from locojax.config.compose import compose_config

MODES = ("colocated", "disaggregated", "auto")
BASE = ["model=llama3_405b", "workload=numina_cot", "mesh=v7x", "mesh.chips=512",
        "placement.rollout_fraction=0.75", "placement.max_staleness=1"]


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    first_s, compile_s, round_trip_s = {}, {}, {}
    for mode in MODES:
        cfg = compose_config([*BASE, f"placement.mode={mode}"])
        start = time.perf_counter()
        plan = compile_plan(cfg)
        first_s[mode] = time.perf_counter() - start
        compile_s[mode] = _median_s(lambda cfg=cfg: compile_plan(cfg), args.repeats)
        round_trip_s[mode] = _median_s(lambda p=plan: plan_from_json(plan_to_json(p)),
                                       args.repeats)
        print(f"{mode:>14}: first compile {first_s[mode]:.3f} s, then {compile_s[mode]:.3f} s; "
              f"JSON round trip "
              f"{round_trip_s[mode]:.3f} s ({plan.topology.hosts} hosts)")
    print(json.dumps({"first_compile_s": first_s, "compile_s": compile_s, "round_trip_s": round_trip_s,
                      "hosts": plan.topology.hosts, "params": plan.model.param_count}))


if __name__ == "__main__":
    main()

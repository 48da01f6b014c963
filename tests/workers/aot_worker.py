"""Test worker: compile plans' programs for TPU topologies' compile-only devices.

Usage: python tests/workers/aot_worker.py TOPOLOGY PROGRAMS OVERRIDE... [--case TOPOLOGY
       PROGRAMS OVERRIDE...]...
    PROGRAMS: comma-separated names of `locojax.aot.programs.PROGRAMS`
Prints one JSON line: {"cases": [{"reports": [ProgramReport fields..., ratio]} or {"error":
the last lines of the case's traceback}, ...]}, in the order given. One process loads libtpu
once for every case (the test sets ALLOW_MULTIPLE_LIBTPU_LOAD, TPU_* and JAX_PLATFORMS=cpu in
its environment).
"""

import dataclasses
import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere

from jax.experimental import topologies  # noqa: E402

from compiler import compile_plan  # noqa: E402
from locojax import aot  # noqa: E402
from locojax.config.compose import compose_config  # noqa: E402


def compile_case(topology: str, programs: str, overrides: list[str]) -> dict:
    plan = compile_plan(compose_config(overrides))
    devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
    reports = aot.compile_programs(plan, devices, programs=programs.split(","))
    return {"reports": [{**dataclasses.asdict(r), "ratio": r.ratio} for r in reports]}


def cases(argv: list[str]) -> list[list[str]]:
    """The arguments split at each `--case`."""
    out: list[list[str]] = [[]]
    for arg in argv:
        if arg == "--case":
            out.append([])
        else:
            out[-1].append(arg)
    return out


def main(argv: list[str]) -> None:
    results = []
    for topology, programs, *overrides in cases(argv):
        try:
            results.append(compile_case(topology, programs, overrides))
        except Exception:  # one case's failure is that case's result
            results.append({"error": traceback.format_exc()[-3000:]})
    print(json.dumps({"cases": results}))


if __name__ == "__main__":
    main(sys.argv[1:])

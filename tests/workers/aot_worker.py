"""Test worker: compile a plan's programs for a TPU topology's compile-only devices.

Usage: python tests/workers/aot_worker.py TOPOLOGY PROGRAMS OVERRIDE...
    PROGRAMS: comma-separated names of `locojax.aot.programs.PROGRAMS`
Prints one JSON line: {"reports": [ProgramReport fields..., ratio]}. Runs in its own process:
it loads libtpu (the test sets ALLOW_MULTIPLE_LIBTPU_LOAD, TPU_* and JAX_PLATFORMS=cpu in its
environment).
"""

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere

from jax.experimental import topologies  # noqa: E402

from compiler import compile_plan  # noqa: E402
from locojax import aot  # noqa: E402
from locojax.config.compose import compose_config  # noqa: E402


def main(topology: str, programs: str, overrides: list[str]) -> None:
    plan = compile_plan(compose_config(overrides))
    devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
    reports = aot.compile_programs(plan, devices, programs=programs.split(","))
    print(json.dumps({"reports": [{**dataclasses.asdict(r), "ratio": r.ratio}
                                  for r in reports]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])

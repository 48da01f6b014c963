"""The process that loads the TPU compiler:
`python -m locojax.aot.worker PLAN_JSON OUT_JSON [PROGRAM,...]`.

Started by `locojax.aot.target` with the environment libtpu needs (JAX_PLATFORMS=cpu,
TPU_ACCELERATOR_TYPE, ...). It asks JAX for the compile-only devices of the plan's TPU slice,
compiles the plan's programs on them (`locojax.aot.programs.compile_programs`) and writes
OUT_JSON (only the named programs of `programs.PROGRAMS` when a third argument names
them, e.g. `train_step`): `{"programs": [...]}`, `{"out_of_memory": {...}}` or `{"topology_error": "..."}`.
Anything else (a bug) exits non-zero with its traceback on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from jax.experimental import topologies

from compiler import plan_from_json
from compiler.hardware import TpuSlice, tpu_slice
from compiler.plan import ExecutionPlan
from locojax.aot.programs import PROGRAMS, ProgramOutOfMemory, compile_programs
from locojax.aot.target import PARENT_ENV
from locojax.runtime.process.parent import die_with


def slice_devices(target: TpuSlice) -> list:
    """The compile-only TPU devices of `target` (ValueError-like errors from libtpu pass)."""
    desc = topologies.get_topology_desc(
        platform="tpu", topology_name=target.topology_name, chip_config_name=target.chip_config,
        chips_per_host_bounds=target.host_bounds, wrap=target.wrap)
    return list(desc.devices)


def host_slice_devices(plan: ExecutionPlan, target: TpuSlice) -> list | None:
    """On a slice of several hosts, the devices of a one-host slice of the same chips: one
    host's programs (the rollout's) are compiled there. They use only that host's devices,
    and libtpu refuses a program whose devices are part of a slice where routing between
    chips is limited (v5e: `device assignment should include all slice devices`). None on a
    one-host slice."""
    if target.hosts == 1:
        return None
    topo = plan.topology
    return slice_devices(tpu_slice(topo.hardware, topo.chips // topo.hosts, 1))


def _mismatch(target: TpuSlice, devices: list) -> str | None:
    """Why the description is not the plan's machine (device or host count), or None."""
    hosts = len({d.process_index for d in devices})
    if len(devices) != target.devices or hosts != target.hosts:
        return (f"it has {len(devices)} devices on {hosts} hosts; the plan has "
                f"{target.devices} on {target.hosts}")
    return None


def run(plan: ExecutionPlan, programs: tuple[str, ...] = PROGRAMS) -> dict[str, Any]:
    """The JSON-ready result of compiling `plan`'s `programs` for its TPU slice."""
    topo = plan.topology
    target = tpu_slice(topo.hardware, topo.chips, topo.hosts)
    try:
        devices = slice_devices(target)
    except Exception as err:  # libtpu's XlaRuntimeError / ValueError: the name was refused
        return {"topology_error": " ".join(str(err).split())}
    why = _mismatch(target, devices)
    if why:
        return {"topology_error": why}
    try:
        reports = compile_programs(plan, devices, programs=programs,
                                   host_devices=host_slice_devices(plan, target))
    except ProgramOutOfMemory as oom:
        return {"out_of_memory": {"program": oom.program, "needed_bytes": oom.needed_bytes,
                                  "available_bytes": oom.available_bytes,
                                  "message": " ".join(oom.message.split())[:500]}}
    return {"programs": [{**dataclasses.asdict(r), "ratio": r.ratio} for r in reports]}


def main(argv: list[str]) -> int:
    """Read the plan, compile, write the result."""
    plan_path, out_path = map(Path, argv[:2])
    programs = tuple(argv[2].split(",")) if len(argv) > 2 else PROGRAMS
    unknown = set(programs) - set(PROGRAMS)
    if unknown:
        raise SystemExit(f"unknown programs {sorted(unknown)}; known: {', '.join(PROGRAMS)}")
    result = run(plan_from_json(plan_path.read_text()), programs)
    out_path.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    if PARENT_ENV in os.environ:  # killed with the process that started it (run_child)
        die_with(int(os.environ[PARENT_ENV]))
    sys.exit(main(sys.argv[1:]))

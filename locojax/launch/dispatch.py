"""Runs a compiled plan: on this process, or as N local host processes (`mesh=cpu`).

On a real cluster every host runs the same `python -m locojax ...` command; each process
joins `jax.distributed` (auto-detected), compiles the same plan and runs its own host's share.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from compiler import ExecutionPlan
from compiler.config import ControllerKind, MeshKind, PlacementMode
from locojax.launch.host import run_here
from locojax.launch.local import launch_local_hosts
from locojax.runtime.preflight import check_resume, check_run_dir, checkpoint_bytes, record
from locojax.runtime.run_dir import write_plan


def with_cpu_devices(count: int) -> None:
    """Give this process `count` CPU devices; must run before JAX is imported."""
    if "jax" in sys.modules:
        raise RuntimeError("JAX was imported before the CPU device count was set")
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={count}"])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def launch(plan: ExecutionPlan, run_dir: Path) -> int:
    """Run `plan` and return an exit code. Before any work the run directory is checked (a
    writable directory with room for a checkpoint, `RunDirError`) and so is what it already
    holds (`ResumeRefused`); only then does it receive plan.json and, on the first launch,
    the record of the configuration it is made with."""
    check_run_dir(run_dir, checkpoint_bytes(plan))
    check_resume(plan, run_dir)
    record(plan, run_dir)
    write_plan(plan, run_dir)
    if plan.placement.mode == PlacementMode.disaggregated:
        from locojax.disagg.driver import run_da  # imports JAX: after with_cpu_devices only

        return run_da(plan, run_dir)
    topo = plan.topology
    if topo.mesh_kind == MeshKind.cpu:
        if plan.controller.kind == ControllerKind.local and topo.hosts > 1:
            return launch_local_hosts(
                topo.hosts, topo.devices_per_host,
                [sys.executable, "-m", "locojax.launch.host", str(run_dir)],
                heartbeat_timeout_s=plan.controller.heartbeat_timeout_s,
            )
        with_cpu_devices(topo.hosts * topo.devices_per_host)
    return run_here(plan, run_dir, host_index=_process_index())


def _process_index() -> int:
    import jax

    return jax.process_index()

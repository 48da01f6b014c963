"""Runs an agreed plan: on this host of a joined job, as N emulated hosts, or as DA Ray actors.

On a real cluster every host runs the same `python -m locojax ...`: each joins the job
(`locojax.launch.join`), compiles and agrees on the plan (`locojax.launch.agree`), checks
the run directory is one for all, and runs its own host's share. The laptop emulation
(`mesh=cpu mesh.hosts=N`) starts N copies of that same command on this machine, joined
through JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID: the start-up path the
emulation tests is the one a cluster runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from compiler import ExecutionPlan
from compiler.config import ControllerKind, DistributedMode, MeshKind, PlacementMode
from locojax.launch.agree import on_every_host, same_run_dir
from locojax.launch.join import SINGLE, Formation
from locojax.launch.local import launch_local_hosts
from locojax.runtime.errors import JobError
from locojax.runtime.observe.progress import already_complete
from locojax.runtime.observe.trackers import check_loggers
from locojax.runtime.process.job import with_device_count
from locojax.runtime.process.loopback import pinned_run_dir
from locojax.runtime.process.stop import STOP_GRACE_S, atomic
from locojax.runtime.rundir.files import HF_DIR, export_problem, write_plan
from locojax.runtime.rundir.owner import RunDirLock, check_layout, check_ours
from locojax.runtime.rundir.preflight import (
    check_resume,
    check_run_dir,
    checkpoint_bytes,
    checkpoint_steps,
    record,
)
from locojax.runtime.rundir.provenance import announce

VERDICT_SLACK_S = 5
"""Seconds past the heartbeat timeout a failed collective waits for the service to name a dead
peer."""


def with_cpu_devices(count: int) -> None:
    """Give this process `count` CPU devices; must run before JAX is imported."""
    if "jax" in sys.modules:
        raise RuntimeError("JAX was imported before the CPU device count was set")
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), count)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def config_dir_args(argv: list[str]) -> list[str]:
    """The `--config-dir` / `-cd` arguments of a command line, absolute: a command started
    again (each emulated host) finds the user's config groups with them."""
    out, it = [], iter(argv)
    for arg in it:
        if arg in ("--config-dir", "-cd"):
            out += ["--config-dir", str(Path(next(it, ".")).absolute())]
        elif arg.startswith("--config-dir="):
            out += ["--config-dir", str(Path(arg.split("=", 1)[1]).absolute())]
    return out


def emulate_hosts(plan: ExecutionPlan, run_dir: Path, overrides: list[str]) -> int:
    """`mesh=cpu mesh.hosts=N`: the same command as N local hosts sharing `run_dir` (each host
    checks the run directory and writes into it as a cluster's hosts do)."""
    if plan.controller.distributed == DistributedMode.off:
        raise JobError(f"controller.distributed=off: mesh.hosts={plan.topology.hosts} emulates "
                       "hosts that join one run; use controller.distributed=auto")
    topo = plan.topology
    command = [sys.executable, "-m", "locojax", *config_dir_args(sys.argv[1:]),
               *pinned_run_dir(overrides, str(run_dir))]
    return launch_local_hosts(topo.hosts, topo.devices_per_host, command,
                              heartbeat_timeout_s=plan.controller.heartbeat_timeout_s,
                              stop_grace_s=STOP_GRACE_S,
                              port=plan.controller.coordinator_port or None)


def _check_dir(plan: ExecutionPlan, run_dir: Path) -> None:
    """One host's checks of the directory itself: a writable directory with room for a
    checkpoint, ours (or run.reuse_dir), every file of the run's layout of the right type."""
    check_run_dir(run_dir, checkpoint_bytes(plan))
    check_ours(run_dir, plan.run.reuse_dir)
    check_layout(run_dir)


@contextlib.contextmanager
def prepared_run_dir(plan: ExecutionPlan, run_dir: Path, formation: Formation) -> Iterator[None]:
    """Before any work: every host checks the run directory (`_check_dir`, `RunDirError`), host
    0 takes its lock for the run's lifetime (another run in it: `RunDirError` naming that
    run), the hosts check it is one directory, every host checks what it holds (`ResumeRefused`);
    a check failing on one host stops all of them. Only then does host 0 write plan.json and,
    on the first launch, the record of the configuration. The lock is released on leaving."""
    timeout, primary = plan.controller.init_timeout_s, formation.host_index == 0
    lock = RunDirLock(run_dir)
    on_every_host("rundir", lambda: _check_dir(plan, run_dir), formation.hosts, timeout)
    on_every_host("lock", lambda: lock.acquire() if primary else None, formation.hosts, timeout)
    try:
        if formation.hosts > 1:  # under the lock: another run's token never mixes in
            same_run_dir(run_dir, formation.host_index, timeout)
        warn = (lambda line: print(line, file=sys.stderr, flush=True)) if primary else None
        on_every_host("resume", lambda: check_resume(plan, run_dir, warn), formation.hosts,
                      timeout)
        if primary:
            with atomic():  # a signal waits: never a .partial left behind
                record(plan, run_dir)
                write_plan(plan, run_dir)
        yield
    finally:
        lock.release()


def finished(plan: ExecutionPlan, run_dir: Path, say: bool = True) -> bool:
    """Whether the run in `run_dir` has done every step and its export is whole: a rerun of
    the same command then has nothing to do. An export there that is not whole (its marker
    damaged, of another step, a file missing) is written again, and `say` tells so."""
    steps = checkpoint_steps(run_dir)
    if not (steps and steps[-1] >= plan.run.steps):
        return False
    problem = export_problem(run_dir / HF_DIR, steps[-1])
    if problem is not None and say and (run_dir / HF_DIR).exists():
        print(f"warning: {problem}; the final export is written again", file=sys.stderr,
              flush=True)
    return problem is None


def launch(plan: ExecutionPlan, run_dir: Path, formation: Formation = SINGLE,
           overrides: list[str] | tuple[str, ...] = ()) -> int:
    """Run `plan` as `formation`'s host and return an exit code.

    `overrides` are the command line's (the emulation passes them to its hosts).
    """
    check_loggers(plan)
    topo = plan.topology
    emulated = topo.mesh_kind == MeshKind.cpu and plan.controller.kind == ControllerKind.local
    if not formation.joined and emulated and topo.hosts > 1 \
            and plan.placement.mode != PlacementMode.disaggregated:
        return emulate_hosts(plan, run_dir, list(overrides))
    with prepared_run_dir(plan, run_dir, formation):
        return _run(plan, run_dir, formation)


def _run(plan: ExecutionPlan, run_dir: Path, formation: Formation) -> int:
    """`launch` once the run directory is checked and held."""
    topo = plan.topology
    # every host sees the same files: all of them stop here
    if finished(plan, run_dir, say=formation.host_index == 0):
        if formation.host_index == 0:
            print(already_complete(plan.run.steps, run_dir, run_dir / HF_DIR), file=sys.stderr)
        return 0
    if formation.host_index == 0:
        announce(plan, run_dir)  # where the weights, dtypes and data come from
    if plan.placement.mode == PlacementMode.disaggregated:
        from locojax.disagg.driver import run_da  # JAX: the CO path sets its device count first

        return run_da(plan, run_dir)
    if plan.controller.kind == ControllerKind.single:
        from locojax.single.driver import run_single  # JAX, as run_da

        return run_single(plan, run_dir)
    if topo.mesh_kind == MeshKind.cpu and not formation.joined:
        with_cpu_devices(topo.hosts * topo.devices_per_host)
    from locojax.co.host import run_here  # JAX: after the device count is set

    if formation.hosts == 1:
        return run_here(plan, run_dir, host_index=formation.host_index)
    import jax  # after with_cpu_devices

    try:
        return run_here(plan, run_dir, host_index=formation.host_index)
    except jax.errors.JaxRuntimeError:
        # A peer that died breaks the collective in flight first (gloo: "connection closed by
        # peer"); the coordination service names it once its heartbeat times out, and
        # `locojax.launch.fatal` turns that into this host's one line. Wait for that verdict;
        # an error no peer explains keeps its traceback.
        time.sleep(plan.controller.heartbeat_timeout_s + VERDICT_SLACK_S)
        raise

"""`locojax-plan ... aot=true`: the plan's programs compiled by the TPU compiler for its slice.

    ExecutionPlan --compiler.hardware.tpu_slice--> TpuSlice (`v5e:4x4`, hosts, accelerator)
      --a child process, `python -m locojax.aot.worker`, with its own environment:
          JAX_PLATFORMS=cpu (its own backend stays CPU), ALLOW_MULTIPLE_LIBTPU_LOAD=1,
          TPU_ACCELERATOR_TYPE, TPU_WORKER_HOSTNAMES=localhost, TPU_LOG_DIR=<temp dir>
        --> topologies.get_topology_desc(...).devices (compile-only TPU devices)
        --> locojax.aot.programs.compile_programs(plan, devices) --> its JSON file
      --> AotReport: per program the compiler's figures beside the plan's; the child's wall
          and CPU seconds and peak RSS

libtpu is loaded only in that child, so neither the user's process nor their environment
sees it. The compiler's out-of-memory becomes a `PlanError` on `mesh.chips` (rule
`tpu_memory`): one line naming the program, the bytes needed and available per device and
the keys that change it. `mesh.chips=0` takes the compiler's verdict: the plan's memory-fit
slice first, then the next larger ones (`FIT_TRIES` in all) until every program fits.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from compiler import PlanError, plan_to_json
from compiler.config import Config, MeshKind
from compiler.hardware import TpuSlice, tpu_slice, valid_chip_count
from compiler.plan import ChipSource, ExecutionPlan
from locojax.runtime.errors import UserError

INSTALL = "pip install 'locojax[tpu]' (libtpu==0.0.42.*, the version jax[tpu]==0.10.2 pins)"
"""How the user gets the TPU compiler."""
FIT_TRIES = 4
"""Slices `mesh.chips=0` tries with the TPU compiler: the plan's choice and the next three."""
GIB = 1024**3
RETUNE_KEYS: dict[str, tuple[str, ...]] = {
    "train": ("workload.prompts_per_step", "mesh.chips", "algorithm.remat",
              "algorithm.optimizer_steps_per_batch", "placement.rollout_fraction"),
    "rollout": ("sampling.slots", "sampling.prompt_store", "workload.prompts_per_step",
                "mesh.rollout_tensor_parallel", "sampling.kv_dtype", "mesh.chips"),
    "": ("mesh.chips", "mesh.rollout_tensor_parallel", "workload.prompts_per_step"),
}
"""Keys that change a program's memory, by the program's kind (its name's first word)."""


@dataclass(frozen=True)
class AotReport:
    """What the TPU compiler said about a plan's programs on the plan's slice."""

    target: TpuSlice
    """The slice as JAX's topology API took it."""
    programs: tuple[dict[str, Any], ...]
    """Per program, `locojax.aot.programs.ProgramReport`'s fields and its `ratio`."""
    wall_s: float
    """Wall seconds of the compiling process (start-up, topology, every compile)."""
    cpu_s: float
    """CPU seconds (user + system) of the compiling process."""
    peak_rss_bytes: int
    """Peak resident memory of the compiling process."""
    chips_tried: tuple[int, ...] = ()
    """`mesh.chips=0`: the chip counts the TPU compiler refused before this one."""


class ProgramDoesNotFit(Exception):
    """The child's report of the compiler's out-of-memory (becomes a `PlanError`)."""

    def __init__(self, program: str, needed: int | None, available: int | None, message: str):
        super().__init__(message)
        self.program, self.needed, self.available, self.message = (
            program, needed, available, message)


def tpu_compiler_installed() -> bool:
    """Whether libtpu (the TPU compiler) can be imported, without importing it."""
    return importlib.util.find_spec("libtpu") is not None


PARENT_ENV = "LOCOJAX_AOT_PARENT"
"""The pid of the process that started the compiling child, which ends when that one does
(`locojax.aot.worker`)."""


def child_env(target: TpuSlice, log_dir: Path, base: dict[str, str] | None = None
              ) -> dict[str, str]:
    """The compiling child's environment: the user's, plus what libtpu needs to run quietly
    and compile-only next to any other process that loaded it."""
    env = dict(os.environ if base is None else base)
    env.update(JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
               TPU_ACCELERATOR_TYPE=target.accelerator_type, TPU_WORKER_HOSTNAMES="localhost",
               TPU_LOG_DIR=str(log_dir))
    return env


def _kind(program: str) -> str:
    first = program.split("_")[0]
    return first if first in RETUNE_KEYS else ""


def out_of_memory_error(plan: ExecutionPlan, target: TpuSlice, oom: ProgramDoesNotFit,
                        value: int, tried: tuple[int, ...] = ()) -> PlanError:
    """The one line of a program the TPU compiler could not fit (`value`: `mesh.chips` as
    configured; `tried`: the smaller slices refused before)."""
    need = f"{oom.needed / GIB:.2f} GiB" if oom.needed else "more than it has"
    have = oom.available or target.device_hbm_bytes
    where = f"{target.topology_name}, {plan.topology.chips} chips" + (
        f"; also refused: {', '.join(map(str, tried))} chips" if tried else "")
    keys = ", ".join(RETUNE_KEYS[_kind(oom.program)])
    rule = (f"the TPU compiler ({where}) finds that {oom.program} needs {need} per device, "
            f"{have / GIB:.2f} GiB available; change {keys}")
    return PlanError("mesh.chips", value, rule, "tpu_memory")


@dataclass(frozen=True)
class ChildRun:
    """One compiling child process: its JSON result (None when it timed out) and its cost."""

    result: dict[str, Any] | None
    wall_s: float
    cpu_s: float
    """User + system CPU seconds of the child alone (`os.wait4`'s rusage)."""
    peak_rss_bytes: int
    timed_out: bool = False


def run_child(plan: ExecutionPlan, target: TpuSlice, programs: tuple[str, ...] = (),
              timeout_s: float | None = None) -> ChildRun:
    """Compile `plan`'s `programs` (all: ()) in a child process for `target`, measuring that
    child alone; past `timeout_s` it is killed and reported (`timed_out`), not waited for."""
    with tempfile.TemporaryDirectory(prefix="locojax-aot-") as tmp:
        plan_path, out_path = Path(tmp, "plan.json"), Path(tmp, "aot.json")
        plan_path.write_text(plan_to_json(plan))
        argv = [sys.executable, "-m", "locojax.aot.worker", str(plan_path), str(out_path)]
        start = time.perf_counter()
        with open(Path(tmp, "stderr.txt"), "w+") as err:
            env = child_env(target, Path(tmp, "tpu_logs")) | {PARENT_ENV: str(os.getpid())}
            proc = subprocess.Popen([*argv, *([",".join(programs)] if programs else [])],
                                    env=env,
                                    stdout=subprocess.DEVNULL, stderr=err)
            status, usage, timed_out = _wait(proc, start, timeout_s)
            wall = time.perf_counter() - start
            err.seek(0)
            stderr = err.read()
        cpu, rss = usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024
        if timed_out:
            return ChildRun(None, wall, cpu, rss, timed_out=True)
        code = os.waitstatus_to_exitcode(status)
        if code != 0 or not out_path.exists():
            tail = "\n".join(stderr.strip().splitlines()[-30:])
            raise RuntimeError(f"the TPU compile process failed (exit {code}):\n{tail}")
        return ChildRun(json.loads(out_path.read_text()), wall, cpu, rss)


def _wait(proc: subprocess.Popen, start: float, timeout_s: float | None):
    """(wait status, rusage, timed out) of `proc`, killed once `timeout_s` has passed."""
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait
            return status, usage, False
        if timeout_s is not None and time.perf_counter() - start > timeout_s:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = -9
            return status, usage, True
        time.sleep(0.2)


def compile_on_tpu(plan: ExecutionPlan) -> AotReport:
    """Every program of `plan` compiled by the TPU compiler for the plan's slice;
    `ProgramDoesNotFit` when one does not fit, a `PlanError` when JAX cannot describe it."""
    topo = plan.topology
    if topo.platform != "tpu":
        raise PlanError("mesh.kind", topo.mesh_kind.value, f"aot=true compiles for a TPU "
                        f"slice; this plan is for {topo.platform} ({topo.accelerator}): choose "
                        "mesh=v4|v5e|v5p|v6e|v7x", "tpu_target")
    target = tpu_slice(topo.hardware, topo.chips, topo.hosts)
    if not tpu_compiler_installed():
        raise UserError(f"aot=true needs the TPU compiler (libtpu), which is not installed: "
                        f"{INSTALL}")
    run = run_child(plan, target)
    result = run.result or {}
    if "topology_error" in result:
        raise PlanError("mesh.chips", topo.chips, f"JAX cannot describe {target.topology_name} "
                        f"as {topo.hosts} hosts: {result['topology_error']}", "tpu_target")
    if "out_of_memory" in result:
        oom = result["out_of_memory"]
        raise ProgramDoesNotFit(oom["program"], oom.get("needed_bytes"),
                                oom.get("available_bytes"), oom.get("message", ""))
    return AotReport(target, tuple(result["programs"]), run.wall_s, run.cpu_s,
                     run.peak_rss_bytes)


def check_on_tpu(cfg: Config, plan: ExecutionPlan, replan: Callable[[Config], ExecutionPlan],
                 compile_fn: Callable[[ExecutionPlan], AotReport] = compile_on_tpu
                 ) -> tuple[ExecutionPlan, AotReport]:
    """The plan and the TPU compiler's report on it. `mesh.chips=0`: the first of the plan's
    memory-fit slice and the next larger valid ones (`FIT_TRIES` in all, each planned by
    `replan`, the entry point's compile) whose programs all fit; a `PlanError` (rule
    `tpu_memory`) when none does."""
    tried: list[int] = []
    last: tuple[ExecutionPlan, ProgramDoesNotFit] | None = None
    for candidate in _candidates(cfg, plan, replan):
        try:
            return candidate, replace(compile_fn(candidate), chips_tried=tuple(tried))
        except ProgramDoesNotFit as oom:
            tried.append(candidate.topology.chips)
            last = (candidate, oom)
    assert last is not None, "the plan itself is always a candidate"
    failed, oom = last
    target = tpu_slice(failed.topology.hardware, failed.topology.chips, failed.topology.hosts)
    raise out_of_memory_error(failed, target, oom, cfg.mesh.chips, tuple(tried[:-1]))


def _candidates(cfg: Config, plan: ExecutionPlan, replan: Callable[[Config], ExecutionPlan]
                ) -> Iterator[ExecutionPlan]:
    """`plan`; with `mesh.chips=0` also the plans on the next larger valid slices."""
    yield plan
    if cfg.mesh.kind != MeshKind.tpu or cfg.mesh.chips != 0:
        return
    hw, chips = cfg.hardware, plan.topology.chips
    larger = [n for n in range(chips + 1, 64 * chips + 1) if valid_chip_count(hw, n)]
    for n in larger[:FIT_TRIES - 1]:
        try:
            bigger = replan(replace(cfg, mesh=replace(cfg.mesh, chips=n)))
        except PlanError:
            continue
        yield replace(bigger, topology=replace(bigger.topology, chips_from=ChipSource.memory_fit))

"""Start-up of every host: join the multi-process job this process is part of, before any JAX
call, so that the same `python -m locojax ...` on every host forms one run.

    controller.distributed=off                               -> one process
    controller.coordinator / num_hosts / host_index          -> "config" (hosts started by hand)
    JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID -> "env" (the local emulation,
                                                                 a Kubernetes Job, any launcher)
    JAX's cluster detection: Slurm, Open MPI, TPU pods, ...  -> its name ("slurm", ...)
    MPICH (PMI_SIZE), a Kubernetes Indexed Job without a count -> one line saying what to add
    nothing (auto)                                           -> one process

Joined with more than one process: `locojax.launch.fatal` supervises the host (a host that
never came or died mid-run is one line), the heartbeat and the timeouts are the plan's
`controller.*` (the same the local launcher gives its hosts), and host 0 prints one line:
how the run was formed, hosts, devices per host.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from compiler.config import Config, ControllerConfig, DistributedMode
from compiler.passes.ranges import range_errors
from locojax.launch.fatal import Context, supervise
from locojax.runtime.errors import JobError
from locojax.runtime.process.job import JobEnv, job_from_env


@dataclass(frozen=True)
class Formation:
    """How this process's run was formed."""

    method: str
    """`single` (one process), `config`, `env`, or JAX's detection method (`slurm`, ...)."""
    hosts: int
    host_index: int
    coordinator: str | None = None

    @property
    def joined(self) -> bool:
        """True when `jax.distributed` runs (even a one-process job asked for with `on`)."""
        return self.method != "single"


SINGLE = Formation("single", 1, 0)


@dataclass(frozen=True)
class JoinMethod:
    """What `join` will do: the method, and the arguments that are known before JAX looks."""

    method: str
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    detect: bool = False
    """Ask JAX's cluster detection for what is missing (Slurm, Open MPI, TPU pods, ...)."""


def _explicit(controller: ControllerConfig, job: JobEnv | None) -> JoinMethod | None:
    """Hosts started by hand: `controller.*` wins, the environment fills the rest."""
    given = controller.coordinator or controller.num_hosts or controller.host_index >= 0
    if not given:
        return None
    base = job or JobEnv("none", None, None)
    plan = JoinMethod("config", controller.coordinator or base.coordinator,
                controller.num_hosts or base.num_processes,
                controller.host_index if controller.host_index >= 0 else base.process_id)
    _check_numbers(plan)
    if None not in (plan.coordinator, plan.num_processes, plan.process_id):
        return plan
    if job is not None and job.method in ("slurm", "ompi", "gketpu"):
        return JoinMethod("config", plan.coordinator, plan.num_processes, plan.process_id, detect=True)
    missing = [key for key, value in (("controller.coordinator", plan.coordinator),
                                      ("controller.num_hosts", plan.num_processes),
                                      ("controller.host_index", plan.process_id))
               if value is None]
    raise JobError(f"{missing[0]}: hosts started by hand need controller.coordinator=host:port, "
                   f"controller.num_hosts=N and controller.host_index=i on each host (missing: "
                   f"{', '.join(missing)})")


def _check_numbers(plan: JoinMethod) -> None:
    """A host index inside the job (the count may come from the environment)."""
    if None not in (plan.num_processes, plan.process_id) and \
            not plan.process_id < plan.num_processes:
        raise JobError(f"controller.host_index={plan.process_id}: must be below the "
                       f"{plan.num_processes} hosts of the job (0 on the coordinator's host)")


def _check_ranges(controller: ControllerConfig) -> None:
    """The `controller.*` values' own ranges, the compiler's rules (the same line as
    `locojax.plan` gives), checked before joining: the plan is compiled after."""
    errors = [e for e in range_errors(Config(controller=controller))
              if e.key.startswith("controller.")]
    if errors:
        raise errors[0]


def plan_join(controller: ControllerConfig, env: Mapping[str, str],
              ask_jax: bool = True) -> JoinMethod | None:
    """What this process joins (None: it runs alone); JobError when the job is not whole.

    JAX's own detection (`detect=True`) is asked last: for Slurm, Open MPI and TPU pods it
    fills the coordinator address and numbers the variables do not give. `ask_jax=False`
    (`mesh=cpu`): without a job's variables, and unless `controller.distributed=on`, the
    process runs alone without asking (the detection imports JAX, which a CPU mesh must not
    do before it sets its device count).
    """
    _check_ranges(controller)
    if controller.distributed == DistributedMode.off:
        return None
    job = job_from_env(env)
    explicit = _explicit(controller, job)
    if explicit is not None:
        return explicit
    on = controller.distributed == DistributedMode.on
    if job is not None and job.method == "env":
        if job.num_processes is None or job.process_id is None:
            raise JobError(f"JAX_COORDINATOR_ADDRESS={job.coordinator}: also set "
                           "JAX_NUM_PROCESSES and JAX_PROCESS_ID on every host")
        if job.num_processes == 1 and not on:
            return None
        return JoinMethod("env", job.coordinator, job.num_processes, job.process_id)
    if job is not None and not job.multi_process and not on:
        return None
    if job is None and not on and not ask_jax:
        return None
    if job is not None and job.method == "mpich":
        raise JobError(f"an MPICH job of {job.num_processes} processes (PMI_SIZE): JAX cannot "
                       "find its coordinator; give controller.coordinator=<host 0>:<port> on "
                       "every host (controller.num_hosts and host_index come from PMI_SIZE/RANK)")
    if job is not None and job.method == "k8s":
        return JoinMethod("k8s", detect=True)
    return JoinMethod("detect" if job is None else job.method, detect=True)


def join(controller: ControllerConfig, env: Mapping[str, str] | None = None,
         log: Callable[[str], None] = print, ask_jax: bool = True) -> Formation:
    """Join the job this process is part of (before any other JAX call); one process if none."""
    env = os.environ if env is None else env
    plan = plan_join(controller, env, ask_jax)
    if plan is None:
        return SINGLE
    from locojax.runtime.process import distributed as dist  # JAX: joined processes only

    # Hydra's logging shows INFO; jax.distributed's start-up notes would be 2-3 lines per host.
    logging.getLogger("jax._src.distributed").setLevel(logging.WARNING)
    on = controller.distributed == DistributedMode.on
    timeouts = dist.Timeouts(controller.init_timeout_s, controller.heartbeat_timeout_s)
    args = dist.JoinArgs(plan.coordinator, plan.num_processes, plan.process_id)
    method = plan.method
    if plan.detect:
        found = dist.detect_cluster(controller.init_timeout_s, env)
        if found is None:
            if plan.method == "k8s":
                raise JobError("a Kubernetes Indexed Job (JOB_COMPLETION_INDEX) does not say "
                               "how many pods it has: set JAX_COORDINATOR_ADDRESS, "
                               "JAX_NUM_PROCESSES and JAX_PROCESS_ID in the pod spec (README, "
                               "Kubernetes), or controller.distributed=off for one process")
            if on or method == "config":
                raise JobError("controller.distributed=on: no multi-process job found (Slurm "
                               "srun step, Open MPI, TPU pod, Kubernetes, JAX_COORDINATOR_ADDRESS) "
                               "and no controller.coordinator; use controller.distributed=auto "
                               "to run one process")
            return SINGLE
        if found.args.num_processes == 1 and not on and method != "config":
            return SINGLE
        method = found.method if method in ("detect", "k8s") else method
        args = dist.JoinArgs(args.coordinator or found.args.coordinator,
                             args.num_processes or found.args.num_processes,
                             found.args.process_id if args.process_id is None else args.process_id,
                             found.args.local_device_ids)
    if args.num_processes and args.num_processes > 1:
        supervise(Context(args.process_id or 0, args.num_processes, args.coordinator or "?",
                          timeouts.init_s, timeouts.heartbeat_s))
    info = dist.initialize(args, timeouts)
    formation = Formation(method, info.process_count, info.process_index, args.coordinator)
    if info.is_coordinator:
        log(describe(formation))
    return formation


def describe(formation: Formation) -> str:
    """The start-up line: method, hosts, devices per host (after joining)."""
    import jax  # joined: jax.distributed has started

    devices = jax.local_devices()
    kind = devices[0].device_kind if devices else "no"
    where = f", coordinator {formation.coordinator}" if formation.coordinator else ""
    return (f"distributed: {formation.hosts} hosts joined ({formation.method}{where}), "
            f"{len(devices)} {kind} device{'s' if len(devices) != 1 else ''} per host")

"""Joins this process to a multi-host JAX run (`jax.distributed`), and what hosts say to each other
before the run starts (a small all-gather of text through the coordination service).

    detect_cluster     what JAX's own cluster detection finds (Slurm, Open MPI, TPU pods, ...)
    initialize         the one call into `jax.distributed.initialize`, with every number given
    init_distributed   the short form for processes a launcher started with
                       JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID
                       (DA trainer actors, test workers)
    all_gather_text    text from every host before the run starts (plan agreement)
    every_host         a small array from every process during the run (statistics, stop flags)

`locojax.launch.join` decides what to join from the config and the environment.

On CPU the cross-process collectives are gloo (JAX's default; set here if left unset).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import jax
import numpy as np
from jax._src import distributed as jax_distributed  # the store: no public API in jax 0.10
from jax._src.clusters import ClusterEnv  # the detection: no public API in jax 0.10
from jax._src.lib import _jax
from jax.experimental import multihost_utils

from locojax.runtime.process.job import job_from_env

ENV_HEARTBEAT = "LOCOJAX_HEARTBEAT_TIMEOUT_S"
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True)
class HostInfo:
    """Where this process sits in the run."""

    process_index: int
    """This process's id, 0 for the coordinator."""
    process_count: int
    """Number of JAX processes (hosts) in the run."""

    @property
    def is_coordinator(self) -> bool:
        """True on the process that writes logs, metrics and checkpoints."""
        return self.process_index == 0


@dataclass(frozen=True)
class JoinArgs:
    """What `jax.distributed.initialize` is given; None fields are left to its detection."""

    coordinator: str | None = None
    """host:port of process 0's coordination service."""
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None
    """Devices this process may use (None: all it sees, or JAX_LOCAL_DEVICE_IDS)."""
    detection: str | None = "deactivate"
    """JAX's `cluster_detection_method`: `deactivate` (the numbers above are the whole truth:
    an outer Slurm or MPI job must not override them), None (JAX looks) or a method name."""


@dataclass(frozen=True)
class Detected:
    """A cluster JAX's own detection found, with every number filled in."""

    method: str
    """JAX's name for it: `slurm`, `ompi`, `gcetpu`, `gketpu`, `K8sCluster`, ..."""
    args: JoinArgs


def _one_task_per_node(env: Mapping[str, str]) -> bool:
    """True when the launcher put one task on each node (Slurm, Open MPI say so)."""
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
    if per_node:
        return all(part.split("(")[0] == "1" for part in per_node.split(","))
    return env.get("OMPI_COMM_WORLD_LOCAL_SIZE") == "1"


def detect_cluster(init_timeout_s: int, env: Mapping[str, str]) -> Detected | None:
    """The multi-process cluster JAX's own detection finds here (Slurm, Open MPI, Cloud TPU
    pods through their metadata, GKE TPU, Kubernetes with the `kubernetes` package), or None.

    The same search `jax.distributed.initialize()` runs, done here so the run can name the
    method and the numbers, and so that one task per node uses every device of its node
    (JAX's own rule gives a Slurm or Open MPI task one device, the one of its local rank).
    """
    with warnings.catch_warnings():  # e.g. Kubernetes without the `kubernetes` package
        warnings.simplefilter("ignore")
        found = next((c for c in ClusterEnv._cluster_types
                      if not c.opt_in_only_method and c.is_env_present()), None)
    if found is None:
        return None
    coordinator = found.get_coordinator_address(
        timeout_secs=init_timeout_s, override_coordinator_port=env.get("JAX_COORDINATOR_PORT"))
    local = found.get_local_process_id()
    devices = None if local is None or _one_task_per_node(env) else (local,)
    args = JoinArgs(coordinator, found.get_process_count(), found.get_process_id(), devices)
    return Detected(found.name or found.__name__, args)


@dataclass(frozen=True)
class Timeouts:
    """The seconds `jax.distributed` waits (plan's `controller.*`)."""

    init_s: int
    """For every host to register; a host that never comes fails the others after it."""
    heartbeat_s: int
    """Silence after which a peer is declared dead and every other host stops."""
    shutdown_s: int = 60
    """For every host at the exit barrier."""


@contextmanager
def _registration_timeout(seconds: int) -> Iterator[None]:
    """Give process 0's coordination service a registration deadline.

    `jax.distributed.initialize` creates the service without one (1 h), so a missing host is
    only noticed by each client's own connect timeout, whose error says nothing of the others.
    With the service's deadline set, every host that joined learns `k/n` tasks registered and
    which are missing (the one-line report of `locojax.launch.fatal` reads it).
    """
    make = _jax.get_distributed_runtime_service

    def with_deadline(*args, **kwargs):
        kwargs.setdefault("cluster_register_timeout", seconds)
        return make(*args, **kwargs)

    _jax.get_distributed_runtime_service = with_deadline
    try:
        yield
    finally:
        _jax.get_distributed_runtime_service = make


def initialize(args: JoinArgs, timeouts: Timeouts) -> HostInfo:
    """Join the run; must come before any other JAX call (jax.devices() included)."""
    if jax.distributed.is_initialized():
        return HostInfo(jax.process_index(), jax.process_count())
    # gloo is the default in jax 0.10.2; an explicit unset value would leave CPU
    # processes without cross-process collectives.
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    bind = None
    if args.coordinator is not None:
        host, _, port = args.coordinator.rpartition(":")
        # The default bind is [::]:port (all interfaces); a local run stays on loopback.
        bind = args.coordinator if host in _LOOPBACK_HOSTS else None
    with _registration_timeout(timeouts.init_s):
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
            local_device_ids=list(args.local_device_ids) if args.local_device_ids else None,
            coordinator_bind_address=bind,
            cluster_detection_method=args.detection,
            initialization_timeout=timeouts.init_s,
            heartbeat_timeout_seconds=timeouts.heartbeat_s,
            shutdown_timeout_seconds=timeouts.shutdown_s,
        )
    return HostInfo(jax.process_index(), jax.process_count())


def init_distributed(
    heartbeat_timeout_s: int,
    *,
    initialization_timeout_s: int = 120,
    shutdown_timeout_s: int = 60,
) -> HostInfo:
    """Join the run a launcher described with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
    JAX_PROCESS_ID (explicit, no cluster detection); one process when they are absent.

    LOCOJAX_HEARTBEAT_TIMEOUT_S, when set (by the local launcher), overrides
    `heartbeat_timeout_s`.
    """
    job = job_from_env(os.environ)
    if job is None or job.method != "env":
        return HostInfo(process_index=0, process_count=1)
    heartbeat_timeout_s = int(os.environ.get(ENV_HEARTBEAT, heartbeat_timeout_s))
    args = JoinArgs(job.coordinator, job.num_processes, job.process_id)
    return initialize(args, Timeouts(initialization_timeout_s, heartbeat_timeout_s,
                                     shutdown_timeout_s))


def all_gather_text(name: str, text: str, timeout_s: int) -> list[str]:
    """Every host's `text` in host order, through the coordination service's key-value store.

    Before the run starts there are no device programs to gather with; the store is what
    `jax.distributed` itself uses to exchange topologies. `name` must be new for each call.
    A host that does not publish within `timeout_s` raises on the others (the heartbeat
    stops them sooner when it died).
    """
    if jax.process_count() == 1:
        return [text]
    client = jax_distributed.global_state.client
    me, n = jax.process_index(), jax.process_count()
    client.key_value_set(f"locojax/{name}/{me}", text)
    return [text if i == me else client.blocking_key_value_get(f"locojax/{name}/{i}",
                                                               timeout_s * 1000)
            for i in range(n)]


def shutdown_distributed() -> None:
    """Leaves the multi-host run (waits at the exit barrier); a no-op when single-process."""
    if jax.distributed.is_initialized():
        jax.distributed.shutdown()


def every_host(values: np.ndarray) -> np.ndarray:
    """Every process's row of small values (processes x k); no collective with one process."""
    if jax.process_count() == 1:
        return values[None]
    return np.asarray(multihost_utils.process_allgather(values))

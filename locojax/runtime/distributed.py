"""Joins this process to a multi-host JAX run (`jax.distributed`), or stays single-process.

Three ways in, checked in order:
1. The local launcher (`locojax.launch.local`) sets LOCOJAX_COORDINATOR (host:port),
   LOCOJAX_NUM_PROCESSES and LOCOJAX_PROCESS_ID: explicit initialize, no cluster detection.
2. LOCOJAX_AUTO_DISTRIBUTED=1, or a multi-process cluster in the environment
   (JAX_COORDINATOR_ADDRESS, Slurm with SLURM_NTASKS > 1, Open MPI): `jax.distributed`
   detects the rest itself (TPU pods need LOCOJAX_AUTO_DISTRIBUTED=1).
3. Otherwise one process, no coordination service.

On CPU the cross-process collectives are gloo (JAX's default; set here if left unset).
"""

import os
from dataclasses import dataclass

import jax

ENV_COORDINATOR = "LOCOJAX_COORDINATOR"
ENV_NUM_PROCESSES = "LOCOJAX_NUM_PROCESSES"
ENV_PROCESS_ID = "LOCOJAX_PROCESS_ID"
ENV_AUTO = "LOCOJAX_AUTO_DISTRIBUTED"
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


def _cluster_detected(env: dict[str, str]) -> bool:
    """True when the environment names a multi-process cluster that jax can auto-detect."""
    if env.get(ENV_AUTO, "") == "1" or "JAX_COORDINATOR_ADDRESS" in env:
        return True
    if "SLURM_JOB_ID" in env and int(env.get("SLURM_NTASKS", "1") or "1") > 1:
        return True
    return "OMPI_MCA_orte_hnp_uri" in env


def init_distributed(
    heartbeat_timeout_s: int,
    *,
    initialization_timeout_s: int = 120,
    shutdown_timeout_s: int = 60,
) -> HostInfo:
    """Joins the multi-host run described by the environment; call before any other JAX call.

    A peer silent for `heartbeat_timeout_s` aborts this process (no hang on a dead host);
    `initialization_timeout_s` bounds the wait for all peers to connect and
    `shutdown_timeout_s` the wait for them at the exit barrier. The local launcher's
    LOCOJAX_HEARTBEAT_TIMEOUT_S, when set, overrides `heartbeat_timeout_s`.
    """
    env = dict(os.environ)
    heartbeat_timeout_s = int(env.get(ENV_HEARTBEAT, heartbeat_timeout_s))
    if jax.distributed.is_initialized():
        return HostInfo(jax.process_index(), jax.process_count())
    # gloo is the default in jax 0.10.2; an explicit unset value would leave CPU
    # processes without cross-process collectives.
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeouts = dict(
        initialization_timeout=initialization_timeout_s,
        heartbeat_timeout_seconds=heartbeat_timeout_s,
        shutdown_timeout_seconds=shutdown_timeout_s,
    )
    if ENV_COORDINATOR in env:
        address = env[ENV_COORDINATOR]
        host = address.rsplit(":", 1)[0]
        # The default bind is [::]:port (all interfaces); a local run stays on loopback.
        bind = address if host in _LOOPBACK_HOSTS else None
        jax.distributed.initialize(
            coordinator_address=address,
            num_processes=int(env[ENV_NUM_PROCESSES]),
            process_id=int(env[ENV_PROCESS_ID]),
            coordinator_bind_address=bind,
            # explicit arguments: never let a Slurm/MPI env of the outer shell override them
            cluster_detection_method="deactivate",
            **timeouts,
        )
    elif _cluster_detected(env):
        jax.distributed.initialize(**timeouts)
    else:
        return HostInfo(process_index=0, process_count=1)
    return HostInfo(jax.process_index(), jax.process_count())


def shutdown_distributed() -> None:
    """Leaves the multi-host run (waits at the exit barrier); a no-op when single-process."""
    if jax.distributed.is_initialized():
        jax.distributed.shutdown()

"""What the environment says about a multi-process job, read from variables only (no JAX).

Checked in order; the first one present describes the job:

    JAX_COORDINATOR_ADDRESS   (+ JAX_NUM_PROCESSES, JAX_PROCESS_ID)  "env": any launcher, the
                              local emulation, a Kubernetes Job that sets them
    SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID   "slurm"
                              (an `srun` step: the variables JAX's own Slurm detection needs)
    OMPI_MCA_orte_hnp_uri     (+ OMPI_COMM_WORLD_SIZE / _RANK)       "ompi": Open MPI's mpirun
    PMI_SIZE, PMI_RANK                                               "mpich": MPICH / Intel MPI
    TPU_WORKER_HOSTNAMES or TPU_PROCESS_ADDRESSES, TPU_WORKER_ID     "gketpu": a TPU slice on GKE
    JOB_COMPLETION_INDEX                                             "k8s": an Indexed Job

A Cloud TPU VM pod describes itself through its metadata server, not its variables; the join
asks JAX's own detection for it (and for anything else JAX knows). `job_name` names the default
run directory, so the same command on every host lands in one place.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
              "SLURM_LOCALID")
"""What JAX's Slurm detection reads (an `srun` step sets them all; a batch script alone does
not set SLURM_STEP_NODELIST)."""


@dataclass(frozen=True)
class JobEnv:
    """A multi-process job as its environment variables describe it."""

    method: str
    """How it was found: `env`, `slurm`, `ompi`, `mpich`, `gketpu` or `k8s`."""
    num_processes: int | None
    """Processes in the job (None: the variables do not say)."""
    process_id: int | None
    """This process's rank (None: the variables do not say)."""
    coordinator: str | None = None
    """host:port of process 0 when the variables give it (`env`)."""
    job_name: str | None = None
    """A name the same on every process of the job, for the default run directory."""

    @property
    def multi_process(self) -> bool:
        """True unless the variables say the job has exactly one process."""
        return self.num_processes != 1


def _int(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key, "").strip()
    return int(value) if re.fullmatch(r"\d+", value) else None


def _safe(text: str) -> str:
    """`text` as one path component."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.") or "job"


def _k8s_job_name(env: Mapping[str, str]) -> str | None:
    """An Indexed Job's pods are named `<job>-<index>-<suffix>` (hostname `<job>-<index>`)."""
    index = env.get("JOB_COMPLETION_INDEX", "")
    host = env.get("HOSTNAME", "")
    match = re.fullmatch(rf"(.+)-{re.escape(index)}(-[a-z0-9]+)?", host) if index else None
    return match.group(1) if match else None


def job_from_env(env: Mapping[str, str]) -> JobEnv | None:
    """The job the environment describes, or None when it describes none."""
    if env.get("JAX_COORDINATOR_ADDRESS"):
        address = env["JAX_COORDINATOR_ADDRESS"]
        return JobEnv("env", _int(env, "JAX_NUM_PROCESSES"), _int(env, "JAX_PROCESS_ID"),
                      coordinator=address, job_name=f"job-{_safe(address)}")
    if all(k in env for k in SLURM_VARS):
        step = env.get("SLURM_STEP_ID", "")
        name = f"slurm-{_safe(env['SLURM_JOB_ID'])}" + (f".{_safe(step)}" if step else "")
        return JobEnv("slurm", _int(env, "SLURM_NTASKS"), _int(env, "SLURM_PROCID"),
                      job_name=name)
    if "OMPI_MCA_orte_hnp_uri" in env:
        jobid = env["OMPI_MCA_orte_hnp_uri"].split(".", 1)[0]
        return JobEnv("ompi", _int(env, "OMPI_COMM_WORLD_SIZE"), _int(env, "OMPI_COMM_WORLD_RANK"),
                      job_name=f"ompi-{_safe(jobid)}")
    if "PMI_SIZE" in env and "PMI_RANK" in env:
        return JobEnv("mpich", _int(env, "PMI_SIZE"), _int(env, "PMI_RANK"))
    workers = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES")
    if workers and "TPU_WORKER_ID" in env:
        count = len(workers.split(",")) * (_int(env, "MEGASCALE_NUM_SLICES") or 1)
        first = workers.split(",")[0].split(":")[0]
        return JobEnv("gketpu", count, None, job_name=f"tpu-{_safe(first)}")
    if "JOB_COMPLETION_INDEX" in env:
        name = _k8s_job_name(env)
        return JobEnv("k8s", None, _int(env, "JOB_COMPLETION_INDEX"),
                      job_name=f"k8s-{_safe(name)}" if name else None)
    return None


DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it): a coordinator's."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def coordinator_env(port: int, processes: int, index: int) -> dict[str, str]:
    """The variables ("env" above) that make a process number `index` of a `processes`-process
    `jax.distributed` job whose coordinator listens on 127.0.0.1:`port`."""
    return {"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": str(processes),
            "JAX_PROCESS_ID": str(index)}


CPU_COLLECTIVE_FLAGS = {"--xla_cpu_collective_call_warn_stuck_timeout_seconds": 120,
                        "--xla_cpu_collective_call_terminate_timeout_seconds": 900}
"""Seconds an XLA:CPU collective among one process's devices waits for its late threads
before it warns, then more before it aborts the process (XLA's own 20 + 40 s are too short
for a loaded machine: docs/runtime.md). A dead peer *process* is the heartbeat's to find."""


def with_device_count(xla_flags: str, devices: int) -> str:
    """`xla_flags` with the host-platform device count set to `devices` (replaced, not added)
    and CPU_COLLECTIVE_FLAGS' timeouts where the flags do not set them; every other flag
    kept."""
    kept = [f for f in xla_flags.split() if not f.startswith(DEVICE_COUNT_FLAG)]
    given = {f.split("=")[0] for f in kept}
    waits = [f"{k}={v}" for k, v in CPU_COLLECTIVE_FLAGS.items() if k not in given]
    return " ".join([*kept, *waits, f"{DEVICE_COUNT_FLAG}={devices}"])

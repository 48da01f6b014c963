"""Starts (or joins) the Ray cluster of a run (DA, the single controller) and always shuts it down.

A local cluster keeps everything under one short temp dir (Unix socket paths are limited to
~107 bytes, so a long run dir cannot hold it); SIGTERM and SIGINT unwind through `finally`,
so Ray's processes never outlive the run. LOCOJAX_RAY_ADDRESS joins an existing cluster.

Both Ray modes (DA, the single controller) start their cluster and actors here, so neither
imports the other. A signal outside a driver's step loop is the entry point's
`stop.Interrupted` (one line, exit 128 + the signal); `interrupted` is both drivers' line for
a plain KeyboardInterrupt (a driver run in process).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from compiler import ExecutionPlan
from compiler.config import MeshKind
from locojax.runtime.process.stop import answers_signals, installed
from locojax.runtime.rundir.files import RAY_DIR

ENV_ADDRESS = "LOCOJAX_RAY_ADDRESS"
ENV_TMPDIR = "LOCOJAX_RAY_TMPDIR"
ENV_LOG = "LOCOJAX_RAY_LOG_TO_DRIVER"
ACTOR_CPUS = 0.5
"""Logical CPUs per actor: 3-4 actors fit a 2-core machine (JAX uses the cores it finds)."""
_MAX_SOCKET_DIR = 40


def free_port() -> int:
    """A free TCP port on the loopback interface (a jax.distributed coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def actor_env(plan: ExecutionPlan, extra: dict[str, str]) -> dict:
    """runtime_env of an actor: its device flags (set before it imports JAX) and the repo."""
    root = str(Path(__file__).resolve().parents[3])
    env = {"PYTHONPATH": root, "TOKENIZERS_PARALLELISM": "false", **extra}
    if plan.topology.mesh_kind == MeshKind.cpu:
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count="
                            f"{plan.topology.devices_per_host}")
    return {"env_vars": env}


def interrupted() -> int:
    """The one line of a driver stopped by a KeyboardInterrupt that is not the entry point's
    `Interrupted` (stop.install() not called: a driver run in process); exit 130."""
    print("interrupted: Ray shut down; rerun the same command to resume from the last "
          "checkpoint", file=sys.stderr)
    return 130


def _temp_dir(run_dir: Path) -> tuple[Path, bool]:
    """(Ray temp dir, created here and to be removed): run_dir/ray when short enough."""
    if os.environ.get(ENV_TMPDIR):
        return Path(os.environ[ENV_TMPDIR]), False
    inside = run_dir.absolute() / RAY_DIR
    if len(str(inside)) <= _MAX_SOCKET_DIR:
        return inside, False
    return Path(tempfile.mkdtemp(prefix="ljray-")), True


@contextlib.contextmanager
def ray_cluster(run_dir: Path, actors: int, log=print) -> Iterator[str]:
    """A running Ray for `actors` actors; yields the temp dir ('' when joining a cluster)."""
    import ray

    address = os.environ.get(ENV_ADDRESS)
    tmp, remove = (None, False) if address else _temp_dir(run_dir)
    stack = contextlib.ExitStack()
    if not answers_signals():  # called in process (tests): SIGTERM unwinds like Ctrl-C
        stack.enter_context(installed())
    try:
        log_to_driver = os.environ.get(ENV_LOG, "0") == "1"
        if address:
            ray.init(address=address, log_to_driver=log_to_driver)
        else:
            # A private cluster on this machine, gone with the run: Ray's token auth would
            # only print a notice and write ~/.ray/auth_token (a user's setting wins).
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            tmp.mkdir(parents=True, exist_ok=True)
            cpus = max(os.cpu_count() or 1, math.ceil(actors * ACTOR_CPUS))
            ray.init(num_cpus=cpus, include_dashboard=False, _temp_dir=str(tmp),
                     log_to_driver=log_to_driver, configure_logging=False,
                     # idle default-env workers would only cost memory: actors get their own
                     _system_config={"enable_worker_prestart": False})
        yield str(tmp or "")
    finally:
        with stack, contextlib.suppress(Exception):
            ray.shutdown()
        if remove and tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def processes_mentioning(marker: str) -> list[int]:
    """Pids of live processes whose command line or cwd mentions `marker` (orphan check)."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline", "cwd"]):
        with contextlib.suppress(psutil.Error):
            text = " ".join(p.info["cmdline"] or []) + " " + (p.info["cwd"] or "")
            if marker in text and p.pid != os.getpid():
                found.append(p.pid)
    return found

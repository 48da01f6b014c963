"""Starts (or joins) the Ray cluster of a run (DA, the single controller) and always shuts it down.

A local cluster keeps everything under one short temp dir (Unix socket paths are limited to
~107 bytes, so a long run dir cannot hold it); SIGTERM and SIGINT unwind through `finally`,
so Ray's processes never outlive the run. LOCOJAX_RAY_ADDRESS joins an existing cluster; an
address that does not accept a connection within LOCOJAX_RAY_WAIT_S seconds (default
`ADDRESS_TIMEOUT_S`) is one line (UserError, exit 2), not Ray's endless reconnect warnings.

No stranger joins a local cluster (CVE-2023-48022: Ray runs whatever code a client sends):
- Every server of the cluster listens on loopback only (`loopback`: node address 127.0.0.2,
  a preloaded bind shim), so no other machine can connect at all.
- Ray's token authentication is on, with a fresh random token per run that only the run's
  processes hold (`RAY_AUTH_TOKEN` in their environment, never written to disk); a client
  without it is refused by every Ray server (`token_auth`).
- Ray makes its temp dir and session dirs world-writable (0777); they live one level below
  a 0700 directory (`<run dir>/ray/r`), so no other user reaches them, and the run ends with
  the group/other write bits removed from every directory there (`_seal`).

Both Ray modes (DA, the single controller) start their cluster and actors here, so neither
imports the other. A signal outside a driver's step loop is the entry point's
`stop.Interrupted` (one line, exit 128 + the signal); `interrupted` is both drivers' line for
a plain KeyboardInterrupt (a driver run in process).
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from compiler import ExecutionPlan
from compiler.config import ControllerKind, MeshKind, PlacementMode
from locojax.runtime.errors import UserError
from locojax.runtime.process.job import with_device_count
from locojax.runtime.process.loopback import loopback, restored_env
from locojax.runtime.process.stop import answers_signals, installed

ENV_ADDRESS = "LOCOJAX_RAY_ADDRESS"
ENV_TMPDIR = "LOCOJAX_RAY_TMPDIR"
ENV_LOG = "LOCOJAX_RAY_LOG_TO_DRIVER"
ENV_WAIT = "LOCOJAX_RAY_WAIT_S"
ACTOR_CPUS = 0.5
"""Logical CPUs per actor: 3-4 actors fit a 2-core machine (JAX uses the cores it finds)."""
ADDRESS_TIMEOUT_S = 15.0
"""How long a LOCOJAX_RAY_ADDRESS has to accept a TCP connection before the run gives up,
unless LOCOJAX_RAY_WAIT_S says otherwise."""
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
_MAX_SOCKET_DIR = 40


def actor_env(plan: ExecutionPlan, extra: dict[str, str]) -> dict:
    """runtime_env of an actor: its device flags (set before it imports JAX) and the repo."""
    root = str(Path(__file__).resolve().parents[3])
    env = {"PYTHONPATH": root, "TOKENIZERS_PARALLELISM": "false", **extra}
    if plan.topology.mesh_kind == MeshKind.cpu:  # the user's other XLA flags kept
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""),
                                             plan.topology.devices_per_host)
    return {"env_vars": env}


def failed_to_start(err: BaseException | None) -> bool:
    """Whether `err` is Ray's word that an actor's `__init__` raised (a setup error the entry
    point's door names), not a lost actor."""
    return err is not None and "raised in its creation task" in str(err)


def starts_local_cluster(plan: ExecutionPlan) -> bool:
    """Whether running `plan` starts a local Ray cluster here (DA or the single controller,
    LOCOJAX_RAY_ADDRESS unset): the runs whose driver needs the loopback shim preloaded
    (`loopback.reexec_preloaded`). A joined cluster's driver must be reachable from it."""
    ray_mode = (plan.placement.mode == PlacementMode.disaggregated
                or plan.controller.kind == ControllerKind.single)
    return ray_mode and not os.environ.get(ENV_ADDRESS)


def interrupted() -> int:
    """The one line of a driver stopped by a KeyboardInterrupt that is not the entry point's
    `Interrupted` (stop.install() not called: a driver run in process); exit 130."""
    print("interrupted: Ray shut down; rerun the same command to resume from the last "
          "checkpoint", file=sys.stderr)
    return 130


def _temp_dir(ray_dir: Path) -> tuple[Path, Path, bool]:
    """(0700 guard dir, Ray's temp dir inside it, guard created here and to be removed):
    `ray_dir` (the run directory's, `rundir.files.RAY_DIR`) when short enough; with LOCOJAX_RAY_TMPDIR, a fresh directory inside it (the
    user's directory itself is never chmod-ed or sealed)."""
    if os.environ.get(ENV_TMPDIR):
        parent = Path(os.environ[ENV_TMPDIR])
        parent.mkdir(parents=True, exist_ok=True)
        guard, remove = Path(tempfile.mkdtemp(prefix="ljray-", dir=parent)), True
    elif len(str(ray_dir.absolute() / "r")) <= _MAX_SOCKET_DIR:
        guard, remove = ray_dir.absolute(), False
    else:
        guard, remove = Path(tempfile.mkdtemp(prefix="ljray-")), True
    guard.mkdir(parents=True, exist_ok=True)
    guard.chmod(0o700)
    return guard, guard / "r", remove


def _seal(guard: Path) -> None:
    """Remove the group/other write bits Ray gave the directories under `guard`."""
    for root, dirs, _ in os.walk(guard):
        for name in [".", *dirs]:
            path = Path(root) / name
            with contextlib.suppress(OSError):
                mode = path.lstat().st_mode
                if not path.is_symlink() and mode & 0o022:
                    path.chmod(mode & 0o7755)


def address_wait_s() -> float:
    """Seconds to wait for LOCOJAX_RAY_ADDRESS: LOCOJAX_RAY_WAIT_S, else `ADDRESS_TIMEOUT_S`
    (UserError naming the variable unless a number in [0, 3600])."""
    text = os.environ.get(ENV_WAIT)
    if text is None:
        return ADDRESS_TIMEOUT_S
    try:
        wait = float(text)
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= 3600:
        raise UserError(f"{ENV_WAIT}={text}: expected seconds from 0 to 3600")
    return wait


def check_address(address: str, timeout_s: float = ADDRESS_TIMEOUT_S) -> None:
    """UserError unless `address` (host:port; `auto` and `ray://` are left to Ray) accepts a
    TCP connection within `timeout_s` (retried: a head node may be starting)."""
    host, sep, port = address.rpartition(":")
    if address == "auto" or "://" in address or not sep:
        return
    if not port.isdigit() or not host:
        raise UserError(f"{ENV_ADDRESS}={address}: not an address (host:port)")
    deadline, reason = time.monotonic() + timeout_s, "no answer"
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
                return
        except OSError as err:
            reason = err.strerror or type(err).__name__
            time.sleep(0.5)
    raise UserError(f"{ENV_ADDRESS}={address}: no Ray cluster answers there within "
                    f"{timeout_s:.0f} s ({reason}); start it (ray start --head) or unset "
                    f"{ENV_ADDRESS} to run a local cluster")


@contextlib.contextmanager
def token_auth() -> Iterator[None]:
    """Ray's token authentication on, with a fresh random token, for the clusters started
    inside; the environment restored after (tests start several in one process)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    try:
        with restored_env(AUTH_ENV):
            os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
            os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
            # Ray read RAY_AUTH_MODE when it was imported: refresh its config and token cache
            # (what Ray's own `_enable_token_auth` does).
            Config.initialize("")
            AuthenticationTokenLoader.instance().reset_cache()
            yield
    finally:  # after the environment is back: Ray re-reads it
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


@contextlib.contextmanager
def ray_cluster(ray_dir: Path, actors: int, log=print) -> Iterator[str]:
    """A running Ray for `actors` actors; yields the temp dir ('' when joining a cluster)."""
    address = os.environ.get(ENV_ADDRESS)
    if address:
        check_address(address, address_wait_s())
    with contextlib.ExitStack() as stack:
        if not answers_signals():  # called in process (tests): SIGTERM unwinds like Ctrl-C
            stack.enter_context(installed())
        if address:
            yield stack.enter_context(_joined(address))
        else:
            yield stack.enter_context(_local(ray_dir, actors, log))


def _log_to_driver() -> bool:
    return os.environ.get(ENV_LOG, "0") == "1"


@contextlib.contextmanager
def _joined(address: str) -> Iterator[str]:
    import ray

    try:
        try:
            ray.init(address=address, log_to_driver=_log_to_driver())
        except ConnectionError as err:
            raise UserError(f"{ENV_ADDRESS}={address}: {str(err).splitlines()[0]}") from None
        yield ""
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()


@contextlib.contextmanager
def _local(ray_dir: Path, actors: int, log) -> Iterator[str]:
    """A private cluster on this machine, gone with the run: token auth, servers on loopback
    (`loopback`), a 0700 temp dir."""
    import ray

    guard, tmp, remove = _temp_dir(ray_dir)
    try:
        with token_auth(), loopback(log) as node_ip:
            try:
                tmp.mkdir(parents=True, exist_ok=True)
                cpus = max(os.cpu_count() or 1, math.ceil(actors * ACTOR_CPUS))
                ray.init(num_cpus=cpus, include_dashboard=False, _temp_dir=str(tmp),
                         log_to_driver=_log_to_driver(), configure_logging=False,
                         # idle default-env workers would only cost memory: actors get theirs.
                         # Ray runs workers at nice 15; ours are the run's rollout and
                         # training, so they run at the driver's priority, not below every
                         # other process of the host (reward workers, data loading).
                         _system_config={"enable_worker_prestart": False,
                                         "worker_niceness": 0},
                         _node_ip_address=node_ip)
                yield str(tmp)
            finally:
                with contextlib.suppress(Exception):
                    ray.shutdown()
    finally:
        if remove:
            shutil.rmtree(guard, ignore_errors=True)
        else:
            _seal(guard)


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

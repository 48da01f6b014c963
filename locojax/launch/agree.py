"""Before a multi-host run starts, its hosts agree: one configuration, one plan, one directory.

    config    every host's resolved configuration (`controller.host_index` left out): the
              hosts all-gather its hash; on a difference they all-gather the values and every
              host refuses with the same line naming the keys (an override passed to one host)
    plan      every host compiles from the topology it detected, then the same for the plan's
              hash (a host that sees other devices, runs another version, or fails to compile)
    run dir   host 0 writes a token into its run directory, the others read theirs after the
              hosts have exchanged it; a host that does not find it is not in the same
              directory (no shared filesystem, or a per-host default): one line on every host
    files     the sha256 of every reward, environment, tool and data file the plan names
              (`runtime.rundir.preflight.file_digests`): a host with another copy stops all,
              the line naming the file and the hosts
    checks    the run directory's own checks (`runtime.preflight`) run on every host and are
              gathered: one host's refusal stops all (`on_every_host`)

Every check ends the same way on every host (they decide from the same gathered text), so no
host is left waiting for one that gave up. One process: every check passes at once.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compiler import ExecutionPlan, PlanError, to_data
from compiler.config import ControllerKind, MeshKind, PlacementMode
from locojax.launch.door import user_error_line
from locojax.launch.join import Formation
from locojax.runtime.errors import JobError, hosts_named
from locojax.runtime.rundir.preflight import file_digests


def all_gather_text(name: str, text: str, timeout_s: int) -> list[str]:
    """Every host's `text` (`runtime.distributed.all_gather_text`). JAX is imported here, in a
    joined run only: a process alone sets its CPU device count after these checks."""
    from locojax.runtime.process import distributed  # JAX: joined processes only

    return distributed.all_gather_text(name, text, timeout_s)


PER_HOST = ("controller.host_index",)
"""Keys that differ between the hosts of one run by design."""
SHOWN = 4
"""Differing keys named in the line; the rest are counted."""
TOKEN = ".locojax-host0-token"
"""Written by host 0 into the run directory during the check, removed after it."""


def flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of nested plain data."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: data}


def _digest(values: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def differences(per_host: list[dict[str, Any]]) -> list[str]:
    """`key: value on host(s) ..., value on host(s) ...` for every key the hosts disagree on."""
    keys = sorted(set().union(*per_host))
    out = []
    for key in keys:
        by_value: dict[str, list[int]] = {}
        for i, values in enumerate(per_host):
            shown = json.dumps(values[key]) if key in values else "(absent)"
            by_value.setdefault(shown, []).append(i)
        if len(by_value) > 1:
            out.append(f"{key} is " + ", ".join(f"{v} on {hosts_named(ids)}"
                                                for v, ids in by_value.items()))
    return out


def _agree(name: str, values: dict[str, Any], what: str, advice: str, timeout_s: int) -> None:
    """Raise JobError on every host unless every host has the same `values`."""
    if len(set(all_gather_text(f"{name}/digest", _digest(values), timeout_s))) == 1:
        return
    gathered = all_gather_text(f"{name}/values", json.dumps(values), timeout_s)
    diffs = differences([json.loads(text) for text in gathered])
    more = f" (and {len(diffs) - SHOWN} more)" if len(diffs) > SHOWN else ""
    raise JobError(f"the hosts {what}: {'; '.join(diffs[:SHOWN])}{more}; {advice}")


def agree_config(cfg: Any, timeout_s: int) -> None:
    """Every host was started with the same configuration (per-host keys aside)."""
    values = {k: v for k, v in flat(to_data(cfg)).items() if k not in PER_HOST}
    _agree("config", values, "were started with different configurations",
           "pass the same overrides to every host", timeout_s)


def agree_plan(compile_plan: Callable[[], ExecutionPlan], timeout_s: int) -> ExecutionPlan:
    """Compile on every host and check the plans are one; a PlanError on any host stops all."""
    try:
        plan, error = compile_plan(), None
    except PlanError as err:
        plan, error = None, err
    mine = {"error": str(error)} if error is not None else {
        k: v for k, v in flat(to_data(plan)).items() if k not in PER_HOST}
    texts = all_gather_text("plan/errors", mine.get("error", ""), timeout_s)
    failed = [(i, text) for i, text in enumerate(texts) if text]
    if error is not None and len(failed) == len(texts) and len(set(texts)) == 1:
        raise error  # the same mistake everywhere: its own keyed line
    if failed:
        i, text = failed[0]
        raise JobError(f"host {i} cannot compile the plan: {text}")
    _agree("plan", mine, "compiled different plans from one configuration",
           "every host must see the same devices and run the same LoCoJAX version", timeout_s)
    return plan


def on_every_host(name: str, check: Callable[[], None], hosts: int, timeout_s: int) -> None:
    """Run `check` on this host; a user error on any host stops every host: the failing host
    with its own line, the others with that line and the host's index. A bug keeps its
    traceback (the other hosts then stop at the heartbeat timeout)."""
    if hosts == 1:
        check()
        return
    error, line = None, ""
    try:
        check()
    except Exception as err:
        line = user_error_line(err) or ""
        if not line:
            raise
        error = err
    texts = all_gather_text(f"{name}/errors", line, timeout_s)
    if error is not None:
        raise error
    failed = [(i, text) for i, text in enumerate(texts) if text]
    if failed:
        i, text = failed[0]
        raise JobError(f"{text} (on host {i})")


def same_run_dir(run_dir: Path, host_index: int, timeout_s: int) -> None:
    """Every host's `run_dir` is one directory (host 0's token is visible to all)."""
    token = secrets.token_hex(16) if host_index == 0 else ""
    path = run_dir / TOKEN
    if host_index == 0:
        path.write_text(token)
    shared = all_gather_text("rundir/token", token, timeout_s)[0]
    try:
        seen = path.read_text() if host_index else token
    except OSError:
        seen = ""
    verdicts = all_gather_text("rundir/seen", "yes" if seen == shared else "no", timeout_s)
    if host_index == 0:
        path.unlink(missing_ok=True)
    apart = [i for i, verdict in enumerate(verdicts) if verdict != "yes"]
    if apart:
        raise JobError(f"hydra.run.dir={run_dir}: {hosts_named(apart)} cannot see host 0's files "
                       "there, so the hosts are not writing one run; pass hydra.run.dir=<a path "
                       "on a filesystem every host shares> (the same on every host)")


def check_topology(plan: ExecutionPlan, formation: Formation) -> None:
    """The plan is for the hosts that joined (or for one process, or for the local emulation)."""
    topo = plan.topology
    key = {MeshKind.cpu: "mesh.hosts", MeshKind.auto: "mesh=auto"}.get(topo.mesh_kind,
                                                                         "mesh.chips")
    if plan.placement.mode == PlacementMode.disaggregated:
        if formation.hosts > 1:
            raise JobError(f"placement.mode=disaggregated: the DA driver runs once and Ray "
                           f"places the hosts, but {formation.hosts} processes joined a job "
                           f"({formation.method}); start it on one host, or use "
                           "placement=colocated")
        return
    if formation.hosts > 1 and plan.controller.kind == ControllerKind.single:
        raise JobError(f"controller.kind=single: one driver places a Ray worker on every "
                       f"host, but {formation.hosts} processes joined a job "
                       f"({formation.method}); start it on one host, or use controller=local")
    emulated = topo.mesh_kind == MeshKind.cpu and plan.controller.kind == ControllerKind.local
    if not formation.joined:
        if topo.hosts > 1 and not emulated and plan.controller.kind == ControllerKind.local:
            raise JobError(f"{key}: the plan is for {topo.hosts} hosts, but this process "
                           "joined no multi-process job; start the same command on every host "
                           "(Slurm srun, TPU pod --worker=all, ...; README, Clusters)")
        return
    if topo.hosts != formation.hosts:
        raise JobError(f"{key}: the plan is for {topo.hosts} hosts, but {formation.hosts} "
                       f"processes joined the job ({formation.method}); use mesh=auto or "
                       "start one process per host")
    import jax  # a joined host only (jax.distributed has started)

    if topo.devices_per_host != jax.local_device_count():
        raise JobError(f"{key}: the plan gives each host {topo.devices_per_host} devices, but "
                       f"this host has {jax.local_device_count()}; use mesh=auto")


def agreed_config(make: Callable[[], Any], formation: Formation, timeout_s: int) -> Any:
    """The resolved configuration (`make()`), the same on every host; a host whose own
    configuration cannot be resolved (an unknown key, say) stops all."""
    made: list[Any] = []
    on_every_host("compose", lambda: made.append(make()), formation.hosts, timeout_s)
    if formation.hosts > 1:
        agree_config(made[0], timeout_s)
    return made[0]


def agree_files(plan: ExecutionPlan, timeout_s: int) -> None:
    """Every host holds the same reward, environment, tool and data files, and the same
    checkpoint tokenizer (by content)."""
    _agree("files", file_digests(plan), "hold different copies of the run's files (sha256)",
           "give every host the same files (a shared filesystem, or one copy everywhere)",
           timeout_s)


def agreed_plan(cfg: Any, formation: Formation,
                compile_plan: Callable[[], ExecutionPlan]) -> ExecutionPlan:
    """The plan every host compiled and agreed on, checked against the hosts that joined,
    whose hosts hold the same files."""
    timeout_s = cfg.controller.init_timeout_s
    plan = agree_plan(compile_plan, timeout_s) if formation.hosts > 1 else compile_plan()
    check_topology(plan, formation)
    if formation.hosts > 1:
        agree_files(plan, timeout_s)
    return plan

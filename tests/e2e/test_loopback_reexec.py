"""Only a run that starts a local Ray cluster pays for the loopback shim's second start-up
(issue 28): the `locojax` command re-executes itself with the shim preloaded after its plan is
compiled, when the plan is DA or the single controller and LOCOJAX_RAY_ADDRESS is unset; a CO
run, a plan-only run and a joined cluster run in the process they started in; a `-m` sweep
with such a job starts once more after compiling its jobs, before the first. The commands
below run the real CLI with `os.execve` observed (it reports its arguments and ends the
process instead of starting Ray); the real re-exec and the loopback-only sockets of a DA run
are checked by tests/e2e/test_da_runtime.py (Ctrl-C test)."""

import json
import os
import subprocess
import sys

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from compiler import compile_plan
from locojax.config.compose import compose_config
from locojax.runtime.process.loopback import ENV_REEXEC, pinned_run_dir, shim
from locojax.runtime.process.ray_cluster import ENV_ADDRESS, starts_local_cluster

DA = ("+experiment=arith_da", "mesh=cpu", "mesh.hosts=3", "placement.rollout_fraction=0.67")
_OBSERVED = """
import json, os, runpy, sys
def execve(path, argv, env):
    print("EXECVE " + json.dumps({"argv": list(argv), "preload": env.get("LD_PRELOAD", "")}),
          file=sys.stderr, flush=True)
    os._exit(0)
os.execve = execve
runpy.run_module("locojax", run_name="__main__", alter_sys=True)
"""


def _plan(*overrides: str):
    cfg = compose_config(list(overrides))
    return compile_plan(cfg, None)


def test_only_a_local_ray_cluster_needs_the_shim(monkeypatch):
    monkeypatch.delenv(ENV_ADDRESS, raising=False)
    assert not starts_local_cluster(_plan("+experiment=arith_co"))
    da = _plan(*DA)
    single = _plan("+experiment=arith_co", "controller=single")
    assert starts_local_cluster(da) and starts_local_cluster(single)
    monkeypatch.setenv(ENV_ADDRESS, "127.0.0.1:6379")  # a joined cluster: nothing to bind
    assert not starts_local_cluster(da) and not starts_local_cluster(single)


def test_the_reexecuted_command_keeps_the_run_directory():
    argv = ["python", "-m", "locojax", "hydra.run.dir=old", "run.steps=2"]
    assert pinned_run_dir(argv, "/r/2026") == ["python", "-m", "locojax", "run.steps=2",
                                               "hydra.run.dir=/r/2026"]
    # Issue 41: a directory whose name Hydra would parse (a comma, a space, parentheses, a
    # quote) reaches the emulated hosts and the re-executed driver quoted, as it was given.
    parser = OverridesParser.create()
    for name in ("/runs/a,b", "/runs/run (1)", "/runs/it's", "/runs/a\\b", "/runs/end\\"):
        pinned = pinned_run_dir(["python", "+hydra.run.dir='x y'"], name)
        assert pinned[0] == "python" and len(pinned) == 2, pinned
        assert parser.parse_override(pinned[1]).value() == name, pinned


def _observed(*args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_REEXEC, "LD_PRELOAD")}
    out = subprocess.run([sys.executable, "-c", _OBSERVED, *args], env=env,
                         capture_output=True, text=True, timeout=300)
    execs = [json.loads(line.removeprefix("EXECVE ")) for line in out.stderr.splitlines()
             if line.startswith("EXECVE ")]
    return out, execs


def test_a_co_plan_runs_in_one_process_and_a_da_run_starts_once_more_preloaded(tmp_path):
    lib, why = shim()
    if lib is None:
        pytest.skip(f"no loopback shim here: {why}")
    out, execs = _observed("+experiment=arith_co", "run.plan_only=true")
    assert out.returncode == 0 and execs == [], out.stderr[-2000:]
    out, execs = _observed(*DA, "run.steps=2", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 0 and len(execs) == 1, out.stderr[-2000:]
    assert execs[0]["preload"].split()[0] == str(lib)
    assert execs[0]["argv"][-1] == f"hydra.run.dir={tmp_path}"
    assert not (tmp_path / "plan.json").exists()  # before the run directory is written


def test_a_sweep_of_da_runs_starts_once_more_before_its_first_job(tmp_path):
    lib, why = shim()
    if lib is None:
        pytest.skip(f"no loopback shim here: {why}")
    sweep = tmp_path / "sweep"
    out, execs = _observed("-m", *DA, "run.steps=2,3", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0 and len(execs) == 1, out.stderr[-2000:]
    assert execs[0]["preload"].split()[0] == str(lib)
    assert not sweep.exists()  # every job compiled, none started

"""tests/warm.py: a `python -m locojax` run forked from the warm server is the same process to
the test as one the interpreter starts (exit code, stdout and stderr, signals), and a run
whose import-time environment differs starts as a subprocess."""

import signal
import subprocess
import sys

import warm
from paths import ROOT
from shared_runs import run_env

REFUSED = [sys.executable, "-m", "locojax", "+experiment=arith_co", "run.stepz=2"]


def test_a_warm_run_exits_and_prints_as_a_subprocess_does():
    cold = subprocess.run(REFUSED, capture_output=True, text=True, cwd=ROOT, env=run_env(),
                          timeout=120)
    hot = warm.run(REFUSED, capture_output=True, text=True, cwd=ROOT, env=run_env(),
                   timeout=120)
    other = warm.Popen(["true"])  # not a locojax run: a subprocess
    assert isinstance(other, subprocess.Popen) and other.wait(timeout=60) == 0
    assert cold.returncode == hot.returncode == 2
    assert (cold.stdout, cold.stderr) == (hot.stdout, hot.stderr)
    assert hot.stderr.startswith("error: run.stepz: no such key"), hot.stderr


def test_a_warm_run_takes_signals_and_reports_them(tmp_path):
    cmd = [*REFUSED[:4], "run.steps=500", f"hydra.run.dir={tmp_path}"]
    assert warm.cold_reason(cmd, run_env()) == ""
    proc = warm.Popen(cmd, cwd=ROOT, env=run_env(), stderr=subprocess.PIPE, text=True)
    assert isinstance(proc, warm.WarmProcess)
    for line in proc.stderr:
        if line.startswith("step 1/"):
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 143, rest[-2000:]
    assert "SIGTERM" in rest, rest[-2000:]


def test_an_import_time_variable_of_its_own_starts_a_subprocess():
    env = run_env() | {"JAX_ENABLE_X64": "1"}
    proc = warm.Popen(REFUSED, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
    assert isinstance(proc, subprocess.Popen) and proc.wait(timeout=120) == 2
    assert "['JAX_ENABLE_X64']" in warm.cold_reason(REFUSED, env)
    # what Ray's driver or libtpu's import set in this process leaks into run_env(): not cold
    leaked = run_env() | {"PYTHONBREAKPOINT": "ray.util.rpdb._driver_set_trace",
                          "TPU_SKIP_MDS_QUERY": "1"}
    assert warm.cold_reason(REFUSED, leaked) == ""

"""Issue 41: a reward worker cannot take the trainer down or outlive it: it leads its own
process group (a timeout kills what the user's code started too), dies with the process that
started it, and does not get the credentials of the services LoCoJAX talks to."""

import os
import subprocess
import sys
import textwrap

import psutil
import pytest
from paths import ROOT
from processes import ended

from locojax.rewards.worker import SECRET_ENV, FnWorker

ROWS = {"prompts": ["p", "q"], "completions": ["a", "b"]}
FNS = '''
import os, subprocess, sys, time
from pathlib import Path

def env_seen(prompts, completions, **columns):
    return [float("HF_TOKEN" in os.environ), float("MY_SERVICE_KEY" in os.environ)]

def spawns_and_hangs(prompts, completions, **columns):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    Path(os.environ["CHILD_PID_FILE"]).write_text(str(child.pid))
    time.sleep(120)

def group(prompts, completions, **columns):
    return [float(os.getpgid(0)), float(os.getpid())]

def oom_score_adj(prompts, completions, **columns):
    return [float(Path("/proc/self/oom_score_adj").read_text())] * len(completions)

def hog(prompts, completions, **columns):
    block = bytearray(1 << 30)  # 1 GiB
    return [float(len(block) > 0)] * len(completions)
'''


@pytest.fixture()
def fns(tmp_path):
    path = tmp_path / "fns.py"
    path.write_text(FNS)
    return path


def test_the_worker_gets_no_credentials_of_ours(fns, monkeypatch):
    assert "HF_TOKEN" in SECRET_ENV and "WANDB_API_KEY" in SECRET_ENV
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("MY_SERVICE_KEY", "the user's own")
    worker = FnWorker()
    try:
        assert worker.call(f"{fns}:env_seen", ROWS, 30.0) == (
            "ok", [0.0, 1.0])
        status, (pgid, pid) = worker.call(f"{fns}:group", ROWS, 30.0)
    finally:
        worker.close()
    assert status == "ok" and pgid == pid != os.getpgid(0)  # its own group: no Ctrl-C mid-call


@pytest.mark.skipif(not os.path.exists("/proc/self/oom_score_adj"), reason="Linux only")
def test_the_oom_killer_takes_the_worker_before_the_trainer(fns):
    worker = FnWorker()
    try:
        status, scores = worker.call(f"{fns}:oom_score_adj", ROWS, 30.0)
    finally:
        worker.close()
    mine = int(open("/proc/self/oom_score_adj").read())
    assert status == "ok" and scores == [1000.0, 1000.0] and mine < 1000


def test_a_timeout_kills_what_the_function_started(fns, tmp_path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("CHILD_PID_FILE", str(pid_file))
    worker = FnWorker()
    try:
        answer = worker.call(f"{fns}:spawns_and_hangs", ROWS, 3.0)
    finally:
        worker.close()
    assert answer[0] == "timeout"
    assert ended(int(pid_file.read_text()), 20)


def test_a_killed_trainer_takes_its_worker_along(fns, tmp_path):
    trainer = textwrap.dedent(f"""
        import sys, time
        from locojax.rewards.worker import FnWorker
        w = FnWorker()
        assert w.call({str(fns)!r} + ":group", {ROWS}, 60.0)[0] == "ok"
        print(w.process.pid, flush=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", trainer], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        worker_pid = int(proc.stdout.readline())
        assert psutil.pid_exists(worker_pid)
        proc.kill()  # SIGKILL: no finalizer, no EOF handling runs in the trainer
        proc.wait()
        assert ended(worker_pid, 20)
    finally:
        proc.kill()


def test_a_worker_over_its_memory_limit_fails_the_call_not_the_host(fns):
    """workload.reward_memory_mb: the worker's address space is limited (RLIMIT_AS), so a
    function allocating past it gets MemoryError (an error answer, counted like any) and the
    next call is answered; the setting reaches the scorer's workers from the plan."""
    from compiler import compile_plan
    from locojax.config.compose import compose_config
    from locojax.runtime.assemble import reward_settings

    plan = compile_plan(compose_config(["+experiment=arith_co", "workload.reward_memory_mb=512"]))
    assert reward_settings(plan.workload).memory_mb == 512
    worker = FnWorker(memory_mb=512)
    try:
        status, why = worker.call(f"{fns}:hog", ROWS, 30.0)
        assert status == "error" and "MemoryError" in why, (status, why)
        status, (pgid, pid) = worker.call(f"{fns}:group", ROWS, 30.0)
        assert status == "ok"
        limit = psutil.Process(int(pid)).rlimit(psutil.RLIMIT_AS)
        assert limit == (512 << 20, 512 << 20)
    finally:
        worker.close()
    unlimited = FnWorker()
    try:
        assert unlimited.call(f"{fns}:hog", ROWS, 30.0) == ("ok", [1.0, 1.0])
    finally:
        unlimited.close()

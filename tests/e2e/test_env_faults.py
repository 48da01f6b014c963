"""Issue 62, items 2, 6 and 7 through `python -m locojax` (CO, sampling.schedule=refill): an
environment class that returns the wrong type stops the run in one line naming it (exit 2), the
char model with an environment is refused at start-up naming the fix; a hostile environment
(it moves cwd, os.environ and sys.path at import, starts processes in its group, in a session
of its own and as a daemon, hangs past workload.env_timeout_s on some turns and raises on its
second) lets the run finish with one warning line a step, and no process it started outlives
the run: on success, on a user error (exit 2) and on Ctrl-C (exit 130)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import warm
from paths import ROOT
from shared_runs import run_env

HOSTILE = '''
import os
import subprocess
import sys
import time

os.chdir("/")  # at import: the trainer and the run directory must not notice
os.environ["HOME"] = "/nowhere"
sys.path.insert(0, "/nowhere")
PIDS = os.environ["SPAWNED_PIDS"]


def _note(pid):
    with open(PIDS, "a") as f:
        f.write(f"{pid}\\n")


class Hostile:
    def __init__(self, row):
        self.turn = 0

    def reset(self):
        _note(subprocess.Popen(["sleep", "600"]).pid)
        _note(subprocess.Popen(["sleep", "600"], start_new_session=True).pid)
        if os.fork() == 0:  # a daemon: nobody's child, a session of its own
            os.setsid()
            if os.fork() == 0:
                _note(os.getpid())
                time.sleep(600)
            os._exit(0)
        return [{"role": "user", "content": "Sum: " + self.row_text()}]

    def row_text(self):
        return "2+3="

    def step(self, reply):
        self.turn += 1
        if os.environ.get("HOSTILE_BAD") == "1":
            return "not a tuple"
        if self.turn == 1 and not os.path.exists(PIDS + ".hung"):
            open(PIDS + ".hung", "w").close()  # one step of the run hangs past its limit
            time.sleep(600)
        if self.turn == 2:
            raise RuntimeError("boom on turn 2")
        return [{"role": "user", "content": "again"}], 0.0, False
'''
BASE = ["+experiment=arith_co", "model.tokenizer=ascii", "model.vocab=100",
        "workload.max_turns=3", "workload.prompts_per_step=4", "workload.group_size=4",
        "algorithm.sft_warmup_steps=0", "run.eval_every=0", "workload.env_timeout_s=1",
        "sampling.schedule=refill"]


def _start(tmp_path: Path, *overrides: str, bad: bool = False) -> subprocess.Popen:
    (tmp_path / "hostile.py").write_text(HOSTILE)
    env = run_env() | {"SPAWNED_PIDS": str(tmp_path / "pids"), "HOSTILE_BAD": str(int(bad))}
    return subprocess.Popen([sys.executable, "-m", "locojax", *BASE,
                       f"workload.env={tmp_path / 'hostile.py'}:Hostile", *overrides,
                       f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                      start_new_session=True,
                      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _left(tmp_path: Path) -> list[int]:
    """The processes the environment started that still run (zombies do not count)."""
    pids = [int(x) for x in (tmp_path / "pids").read_text().split()] \
        if (tmp_path / "pids").exists() else []
    time.sleep(1.0)  # a worker's watcher polls its parent every 0.5 s
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.slow
def test_a_hostile_environment_lets_the_run_finish_and_leaves_nothing_running(tmp_path):
    run = _start(tmp_path, "run.steps=2")
    out, err = run.communicate(timeout=900)
    assert run.returncode == 0 and "Traceback" not in out + err, err[-3000:]
    said = [line for line in (out + err).splitlines() if ": environment " in line]
    assert [line.split(": environment ")[0].rsplit(" - ", 1)[-1] for line in said] == [
        "step 1", "step 2"], said
    assert all("Hostile failed in " in line for line in said)
    assert (tmp_path / "pids.hung").exists()  # one step hung past its limit, and the run went on
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2 and (tmp_path / "run" / "hf" / "model.safetensors").is_file()
    assert not (Path("/") / "metrics.jsonl").exists()
    assert len((tmp_path / "pids").read_text().split()) >= 3 * 16
    assert _left(tmp_path) == []


@pytest.mark.slow
def test_a_wrong_return_is_one_line_and_leaves_nothing_running(tmp_path):
    run = _start(tmp_path, "run.steps=2", bad=True)
    out, err = run.communicate(timeout=900)
    lines = [line for line in err.splitlines() if line.strip()]
    assert run.returncode == 2 and len(lines) == 1, err[-3000:]
    assert "hostile.py:Hostile.step returned 'not a tuple'" in lines[0]
    assert "Traceback" not in out + err
    assert _left(tmp_path) == []


@pytest.mark.slow
def test_ctrl_c_leaves_nothing_running(tmp_path):
    run = _start(tmp_path, "run.steps=50", "run.checkpoint_every=0")
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while not (metrics.exists() and metrics.read_text().strip()):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.1)
    os.kill(run.pid, signal.SIGINT)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 130 and "Traceback" not in out + err, err[-3000:]
    assert _left(tmp_path) == []


def test_the_char_model_with_an_environment_is_refused_naming_the_fix(tmp_path):
    (tmp_path / "hostile.py").write_text(HOSTILE)
    out = warm.run([sys.executable, "-m", "locojax", "+experiment=arith_co",
                    f"workload.env={tmp_path / 'hostile.py'}:Hostile", "run.steps=1",
                    f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT,
                   env=run_env() | {"SPAWNED_PIDS": str(tmp_path / "pids")},
                   capture_output=True, text=True, timeout=600)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("error: model.tokenizer=char: cannot write the turn format")
    assert "model.tokenizer=ascii model.vocab=100" in lines[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()

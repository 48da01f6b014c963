"""A task of the user's end to end: examples/reverse's JSONL and two reward functions in a
file outside the package, 3 steps on 2 emulated hosts in CO (DA's rollout hosts scoring their
own rows: test_multiturn_runs' DA run, with the transcript as `messages`); each function's mean
in metrics.jsonl and each host scoring its own rows, no accuracy without workload.correct;
a function failing on every row stops the run in one line, exit 2, its checkpoint kept; a
wrong length exits 2 in one line (CO, and DA, whose rollout actor scores: its smallest run,
test_signal_tail's mesh and model); a changed reward file refuses a resume."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import warm
from paths import ROOT
from shared_runs import run_env

from locojax.rewards.scorer import UNJUDGED

EXAMPLE = ROOT / "examples" / "reverse"
BASE = ["workload=custom", f"+workload.data_files.train={EXAMPLE / 'train.jsonl'}",
        "algorithm.sft_warmup_steps=0", "run.eval_every=0", "run.steps=3",
        "workload.prompts_per_step=8", "workload.group_size=4"]
SPY = '''
import os, json
from pathlib import Path

def spy(prompts, completions, target, **columns):
    with open(os.environ["REWARD_SPY"], "a") as f:
        f.write(json.dumps({"host": os.getppid(), "rows": len(completions)}) + "\\n")
    return [float(c.strip().startswith(t)) for c, t in zip(completions, target)]

def late(prompts, completions, **columns):
    """Fails on every row once the run has written a step's row."""
    metrics = Path(os.environ["RUN_DIR"]) / "metrics.jsonl"
    if metrics.exists() and metrics.read_text().strip():
        raise RuntimeError("late failed\\nmore")
    return [0.5] * len(completions)

def short(prompts, completions, **columns):
    return []
'''


def _run(run_dir: Path, *overrides: str, env=None, timeout=900) -> subprocess.CompletedProcess:
    env = run_env() | (env or {})
    cmd = [sys.executable, "-m", "locojax", *BASE, *overrides, f"hydra.run.dir={run_dir}"]
    return warm.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                    env=env)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _fns(tmp_path: Path, **names: str) -> list[str]:
    path = tmp_path / "user_rewards.py"
    path.write_text(SPY)
    return [f"+workload.reward_fns.{k}={v}" for k, v in names.items()]


def _check_two_hosts(tmp_path: Path, run_dir: Path, out) -> None:
    assert out.returncode == 0, out.stderr[-3000:]
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert {"reward/spy", "reward/overlap", "reward_fail/spy"} <= set(r)
        assert 0 <= r["reward/overlap"] <= 1 and r["reward_fail/spy"] == 0
    calls = [json.loads(x) for x in (tmp_path / "spy.jsonl").read_text().splitlines()]
    hosts = {c["host"] for c in calls}
    assert len(hosts) == 2, calls  # two host processes each scored what they sampled
    assert os.getpid() not in hosts


def test_co_two_hosts_score_their_own_rows(tmp_path):
    fns = _fns(tmp_path, spy=f"{tmp_path / 'user_rewards.py'}:spy",
               overlap=f"{EXAMPLE / 'rewards.py'}:overlap")
    out = _run(tmp_path / "run", "+experiment=arith_co", "mesh=cpu", "mesh.hosts=2", *fns,
               env={"REWARD_SPY": str(tmp_path / "spy.jsonl")})
    _check_two_hosts(tmp_path, tmp_path / "run", out)
    assert all(r["samples_per_host"] == [16, 16] for r in _rows(tmp_path / "run"))
    # no workload.correct: correctness unknown, accuracy left out, said once (issue 40)
    assert not any("accuracy" in r for r in _rows(tmp_path / "run"))
    assert out.stdout.splitlines().count(UNJUDGED) == 1


def test_a_function_failing_on_every_row_stops_the_run_in_one_line(tmp_path):
    """Step 0 scores; from step 1 `late` raises on every row: exit 2, one line naming it,
    the step-1 checkpoint kept (isolated failures: tests/runtime/test_user_task.py)."""
    user = tmp_path / "user_rewards.py"
    fns = _fns(tmp_path, late=f"{user}:late", exact=f"{EXAMPLE / 'rewards.py'}:exact")
    run_dir = tmp_path / "run"
    out = _run(run_dir, "+experiment=arith_co", "run.checkpoint_every=1", *fns,
               env={"RUN_DIR": str(run_dir)})
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stdout + out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: reward function late (") and "every row" in last
    assert "RuntimeError: late failed" in last and "more" not in last
    assert [r["step"] for r in _rows(run_dir)] == [0]
    assert (run_dir / "checkpoints" / "1").is_dir()


@pytest.mark.parametrize("mode", [
    ["+experiment=arith_co"],
    # DA: one rollout actor (it scores) and a trainer
    pytest.param(["+experiment=arith_da", "mesh=cpu", "mesh.hosts=2",
                  "placement.rollout_fraction=0.5", "model.num_layers=1", "model.hidden=64",
                  "model.ffn=128", "workload.max_response_len=8"],
                 marks=[pytest.mark.slow, pytest.mark.ray])], ids=["co", "da"])
def test_a_wrong_length_exits_2_in_one_line(tmp_path, mode):
    fns = _fns(tmp_path, short=f"{tmp_path / 'user_rewards.py'}:short")
    out = _run(tmp_path / "run", *mode, *fns)
    assert out.returncode == 2, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert "Traceback" not in out.stderr and "ray::" not in last
    assert last.startswith("error: reward function short") and "returned 0 values for" in last


def test_a_changed_reward_file_refuses_the_resume(tmp_path):
    fns = _fns(tmp_path, spy=f"{tmp_path / 'user_rewards.py'}:spy")
    env = {"REWARD_SPY": str(tmp_path / "spy.jsonl")}
    out = _run(tmp_path / "run", "+experiment=arith_co", "run.checkpoint_every=3", *fns, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    (tmp_path / "user_rewards.py").write_text(SPY + "\n# changed\n")
    again = _run(tmp_path / "run", "+experiment=arith_co", "run.checkpoint_every=3",
                 "run.steps=4", *fns, env=env)
    assert again.returncode == 2, again.stderr[-3000:]
    assert "workload.reward_fn_sha256.spy" in again.stderr and "Traceback" not in again.stderr


def test_a_hub_name_in_data_files_is_one_line_when_it_cannot_load(tmp_path):
    # Not a local path and shaped org/name: `datasets.load_dataset` is asked (no network
    # here; with one, the hub has no such data set): one line naming the key and the name.
    out = _run(tmp_path / "run", "+experiment=arith_co",
               "++workload.data_files.train=nosuchorg/nosuch-set:validation",
               f"+workload.reward_fns.exact={EXAMPLE / 'rewards.py'}:exact")
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert "Traceback" not in out.stderr
    assert lines[-1].startswith("error: workload.data_files.train=nosuchorg/nosuch-set:"
                                "validation: cannot load hub data set nosuchorg/nosuch-set "
                                "split 'validation' (")

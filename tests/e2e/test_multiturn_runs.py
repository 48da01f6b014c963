"""Multi-turn episodes end to end: examples/guess's environment trained 2 steps in CO on 2
emulated hosts (and the run's checkpoint evaluated by `locojax-eval`, in episodes too), in DA with 2 rollout hosts and with the single controller on 2 hosts; every
row has the turn metrics, and each episode's environment ran where the mode runs host work
(CO: the host that sampled it; DA: its rollout actor; single controller: the driver). The DA
run trains LoRA adapters: its trainer sends the adapters only, in the plan's bytes."""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import psutil
import pytest
import warm
from paths import ROOT
from shared_runs import run_env

from compiler import plan_from_json
from locojax.runtime.process.ray_cluster import ENV_TMPDIR, processes_mentioning

EXAMPLE = ROOT / "examples" / "guess"
BASE = ["--config-dir", str(EXAMPLE / "conf"), "+experiment=guess_co", "run.steps=2",
        "workload.prompts_per_step=4", "workload.group_size=2", "workload.max_turns=3",
        "run.eval_every=2", "workload.eval_prompts=3", "workload.max_episode_len=64"]
"""Room for 3 turns (8 reply tokens, then the environment's message: ~14 tokens in the chat
template); the example's 112 cost the Qwen head 40% more columns."""
SPY = f'''
import json, os, sys
sys.path.insert(0, {str(EXAMPLE)!r})
from env import GuessNumber


class Spy(GuessNumber):
    def __init__(self, row):
        super().__init__(row)
        with open(os.environ["ENV_SPY"], "a") as f:
            f.write(json.dumps({{"parent": os.getppid()}}) + "\\n")
'''
REWARDS = '''
import json, os


def spy(prompts, completions, messages, secret, **columns):
    """1 when the last reply names the secret; says which process scored how many rows."""
    roles = sorted({m["role"] for ms in messages for m in ms})
    with open(os.environ["REWARD_SPY"], "a") as f:
        f.write(json.dumps({"host": os.getppid(), "rows": len(completions), "roles": roles})
                + "\\n")
    return [float(str(s) in c) for c, s in zip(completions, secret, strict=True)]
'''
TURN_KEYS = {"turns_mean", "turns_max", "tool_calls", "tool_errors", "env_errors",
             "tool_results_cut", "tool_calls_dropped", "env_s",
             "env_wait_s", "device_idle_frac", "slot_busy_frac",
             "truncated_frac", "episode_len_mean"}


def _run(tmp_path: Path, *overrides: str, env: dict[str, str] | None = None
         ) -> tuple[subprocess.CompletedProcess, list[int], int]:
    """The run's output, the parent pid of each environment instance, the run's pid."""
    (tmp_path / "spy.py").write_text(SPY)
    (tmp_path / "user_rewards.py").write_text(REWARDS)
    spy = tmp_path / "spy.jsonl"
    proc = warm.Popen([sys.executable, "-m", "locojax", *BASE,
                       f"workload.env={tmp_path / 'spy.py'}:Spy", *overrides,
                       f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT,
                      env=run_env() | {"ENV_SPY": str(spy),
                                       "REWARD_SPY": str(tmp_path / "rewards.jsonl")}
                      | (env or {}),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=900)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert proc.returncode == 0, err[-3000:]
    parents = [json.loads(x)["parent"] for x in spy.read_text().splitlines()]
    return done, parents, proc.pid


def _rows(tmp_path: Path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def _check_rows(tmp_path: Path) -> None:
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == [0, 1]
    # held-out evaluation runs greedy episodes too (3 prompts: host shares of 2 and 1)
    assert 0 <= rows[-1]["eval_greedy_accuracy"] <= 1 and rows[-1]["eval_s"] > 0
    for r in rows:
        assert TURN_KEYS <= set(r), sorted(TURN_KEYS - set(r))
        assert 1 <= r["turns_mean"] <= r["turns_max"] <= 3 and r["env_errors"] == 0
        assert r["env_s"] > 0 and r["episode_len_mean"] > 0
        assert r["env_wait_s"] > 0 and 0 < r["device_idle_frac"] < 1
        assert 0 < r["slot_busy_frac"] <= 1
        # the step rewards (-0.1 a wrong guess) reach the reward: never above 1
        assert -0.3 - 1e-6 <= r["reward_mean"] <= 1


@pytest.mark.slow
def test_co_hosts_run_their_own_environments(tmp_path):
    # Per-episode scheduling (the default, sampling.schedule=refill) through 2 slots a host:
    # each host's 4 episodes a step, an ended episode's slot taken by the next, each turn
    # begun as its environment answered; trained with GSPO's sequence ratio over 2 updates
    out, parents, _ = _run(tmp_path, "mesh=cpu", "mesh.hosts=2", "sampling.slots=2",
                           "algorithm.ratio_level=sequence",
                           "algorithm.optimizer_steps_per_batch=2")
    _check_rows(tmp_path)
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    batch = plan["batch"]
    assert (batch["waves_in_flight"], batch["rollout_waves"]) == (1, 2)
    assert plan["sampling"]["schedule"] == "refill"
    assert (plan["algorithm"]["ratio_level"], batch["optimizer_steps"]) == ("sequence", 2)
    assert all(np.isfinite(r["pg_loss"]) and 0 <= r["clip_frac"] <= 1 for r in _rows(tmp_path))
    # 4 prompts x 2 episodes a step over 2 hosts: each host opened its own 4 a step
    # and the evaluation's 3 greedy episodes (2 on host 0, 1 on host 1)
    assert len(parents) == 2 * 8 + 3 and len(set(parents)) == 2
    assert sorted(parents.count(p) for p in set(parents)) == [9, 10]
    assert "Traceback" not in out.stderr
    # locojax-eval on the run directory runs the same episodes (2 prompts, 1 greedy sample):
    # two more environments, one per episode, each reply scored as training's are
    spy = tmp_path / "spy.jsonl"
    done = warm.run([sys.executable, "-m", "locojax.eval", *BASE,
                     f"workload.env={tmp_path / 'spy.py'}:Spy", "eval.samples=1",
                     "eval.prompts=2", f"eval.checkpoint={tmp_path / 'run'}"],
                    cwd=ROOT, env=run_env() | {"ENV_SPY": str(spy)}, capture_output=True,
                    text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(spy.read_text().splitlines()) == len(parents) + 2
    rows = [json.loads(x) for x in (tmp_path / "run" / "eval" / "samples.jsonl")
            .read_text().splitlines()]
    assert len(rows) == 2 and all(len(r["completions"]) == 1 for r in rows)


@pytest.mark.slow
@pytest.mark.ray
def test_da_rollout_hosts_run_their_own_environments_and_reward_functions(tmp_path):
    """DA with 2 rollout hosts, scored by a reward function of the user's (the transcript
    as its `messages` column): each rollout actor runs its own episodes' environments and
    scores its own rows (test_user_task_runs covers the same in CO with single replies).
    The run trains LoRA adapters with CISPO's loss, and the trainer sends the adapters
    only: every step's transfer is the plan's bytes, the export is the adapters (one DA run
    for all: each is mostly a Ray cluster's start)."""
    ray_tmp = tempfile.mkdtemp(prefix="ljm-", dir="/tmp")  # short: Ray's socket paths
    out, parents, pid = _run(tmp_path, "placement=disaggregated", "mesh=cpu", "mesh.hosts=3",
                             "placement.rollout_fraction=0.67", "workload.reward=python",
                             f"+workload.reward_fns.spy={tmp_path / 'user_rewards.py'}:spy",
                             # eval_greedy_accuracy needs a verdict (issue 40)
                             "workload.correct=spy",
                             "algorithm.lora.rank=8", "algorithm.lora.learning_rate=5e-3",
                             "algorithm.loss=cispo", env={ENV_TMPDIR: ray_tmp})
    _check_rows(tmp_path)
    assert len(set(parents)) == 2 and len(parents) >= 2 * 8 + 3
    for r in _rows(tmp_path):
        assert 0 <= r["reward/spy"] <= 1 and r["reward_fail/spy"] == 0
    calls = [json.loads(x) for x in (tmp_path / "rewards.jsonl").read_text().splitlines()]
    assert {c["host"] for c in calls} == set(parents) and pid not in parents
    assert all(c["roles"] == ["assistant", "user"] for c in calls)  # whole transcripts
    assert sum(c["rows"] for c in calls) >= 2 * 8
    # LoRA: the adapters only cross to the rollout hosts, every step the plan's bytes.
    plan = plan_from_json((tmp_path / "run" / "plan.json").read_text())
    receivers = len(plan.partitions.rollout_hosts)
    assert plan.transfer.total_bytes == plan.model.adapter_bytes * receivers
    assert plan.model.adapter_bytes < plan.model.param_bytes / 5
    assert plan.algorithm.loss == "cispo"
    for r in _rows(tmp_path):
        assert r["transfer_bytes"] == plan.transfer.total_bytes
    assert (tmp_path / "run" / "hf" / "lora" / "adapter_model.safetensors").exists()
    assert processes_mentioning(ray_tmp) == []
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.ray
def test_the_single_controller_runs_every_environment_in_its_driver(tmp_path):
    out, parents, pid = _run(tmp_path, "controller=single", "mesh=cpu", "mesh.hosts=2",
                             "sampling.slots=2")
    _check_rows(tmp_path)
    assert set(parents) == {pid} and len(parents) == 2 * 8 + 3
    rows = _rows(tmp_path)
    # per-episode scheduling through 2 slots a worker: a round trip to each worker with a
    # reply running per chunk of decode steps (the environments of the episodes whose
    # replies ended run in the driver meanwhile; two episodes a slot, at least one turn
    # each), and one to train
    assert all(r["host_dispatches"] >= 2 * (2 + 1) for r in rows)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


LONG = f'''
import sys
sys.path.insert(0, {str(EXAMPLE)!r})
from env import GuessNumber

PAD = " ".join(["Think about it carefully and try once more."] * 6)


class LongHints(GuessNumber):
    """The example's hints, each longer than a reply (~60 tokens against 8)."""

    def step(self, reply):
        messages, reward, done = super().step(reply)
        return [dict(m, content=m["content"] + " " + PAD) for m in messages], reward, done
'''


@pytest.mark.slow
def test_refilled_slots_beside_long_observations_keep_the_trainers_log_probs(tmp_path):
    """Issue 60's acceptance in CO: under sampling.schedule=refill, 2 slots, hints longer
    than a reply (an extend piece wider than the other slot's room), the sampler's log-probs
    are the trainer's within float32 rounding (before the fix: 0.58 and 0.91 on a run of
    this kind)."""
    (tmp_path / "long.py").write_text(LONG)
    done = warm.run([sys.executable, "-m", "locojax", *BASE[:4], "run.steps=1",
                     "workload.prompts_per_step=4", "workload.group_size=2",
                     "workload.max_turns=3", "run.eval_every=0", "workload.max_episode_len=256",
                     "sampling.slots=2", "sampling.schedule=refill",
                     f"workload.env={tmp_path / 'long.py'}:LongHints",
                     f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=run_env(),
                    capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = _rows(tmp_path)
    assert row["turns_mean"] > 1 and row["logp_mismatch_max"] < 1e-4, row

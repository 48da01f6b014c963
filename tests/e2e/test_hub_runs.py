"""Environment hubs end to end: a verifiers 0.4 environment (examples/hubs/vf_guess.py: a
taskset, its @reward and @stop, an Env whose run() plays the user) and OpenEnv's own echo
environment (its `init` template), each trained 2 steps in CO by LoCoJAX's own engine, the
rows and the reward the environment's; a taskset that cannot load is one line, exit 2. Each
skips without its extra (CI's `test` has verifiers; openenv cannot be installed beside it)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import warm
from paths import ROOT
from shared_runs import run_env

pytestmark = pytest.mark.slow
needs_verifiers = pytest.mark.skipif(importlib.util.find_spec("verifiers") is None,
                                     reason="the verifiers extra: pip install -e '.[verifiers]'")
needs_openenv = pytest.mark.skipif(importlib.util.find_spec("openenv") is None,
                                   reason="the openenv extra: pip install -e '.[openenv]'")

ASCII = ["model.tokenizer=ascii", "model.vocab=100", "workload.chat_template=false",
         "model.hidden=64", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
         "model.head_dim=16", "model.ffn=128"]
"""The tool demo's tiny model: one token a character, the plain turn format."""
RUN = ["workload=hub", f"workload.env=verifiers:{ROOT / 'examples' / 'hubs' / 'vf_guess.py'}",
       "+workload.env_args.high=5", *ASCII, "workload.max_prompt_len=48",
       "workload.max_response_len=8", "workload.max_turns=3", "workload.max_episode_len=64",
       "workload.prompts_per_step=4", "workload.group_size=2", "workload.eval_prompts=2",
       "run.steps=2", "run.eval_every=0", "run.checkpoint_every=0"]


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return warm.run([sys.executable, "-m", "locojax", *argv], capture_output=True, text=True,
                    timeout=900, cwd=ROOT, env=run_env() | (env or {}))


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    return rows


@needs_verifiers
def test_a_verifiers_environment_trains_two_steps(tmp_path: Path):
    out = _run(*RUN, f"hydra.run.dir={tmp_path}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert "data: hub from the verifiers environment" in out.stdout + out.stderr
    for r in _rows(tmp_path):
        # the environment's reward only (its rubric: 1 for the secret), the reward fn's 0
        assert 0 <= r["reward_mean"] <= 1 and r["reward/environment"] == 0
        assert r["env_errors"] == 0 and 1 <= r["turns_mean"] <= r["turns_max"] <= 3
        assert r["env_s"] > 0 and r["episode_len_mean"] > 0


@needs_verifiers
def test_a_taskset_that_cannot_load_is_one_line():
    out = _run("workload=hub", "workload.env=verifiers:no_such_taskset", *ASCII,
               "run.plan_only=false", "run.steps=1")
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert "workload.env=verifiers:no_such_taskset" in lines[0] and "not found" in lines[0]
    assert "Traceback" not in out.stdout + out.stderr


@needs_openenv
def test_openenvs_echo_environment_trains_two_steps_in_process(tmp_path: Path):
    from openenv.cli.commands import init

    init._copy_template_directory("openenv.cli.templates", "openenv_env",
                                  tmp_path / "echo_env",
                                  init._create_template_replacements("echo_env"), "echo_env")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    out = _run("workload=hub",
               "workload.env=openenv:echo_env.server.echo_env_environment:EchoEnvironment",
               *ASCII, "workload.max_prompt_len=192", "workload.max_response_len=8",
               "workload.max_turns=2", "workload.max_episode_len=128",
               "workload.prompts_per_step=4", "workload.group_size=2", "run.steps=2",
               "run.eval_every=0", "run.checkpoint_every=0", f"hydra.run.dir={tmp_path / 'run'}",
               env={"PYTHONPATH": path})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    for r in _rows(tmp_path / "run"):
        # the echo's reward, min(0.1 x the message's length, 1), each of 2 turns
        assert 0 < r["reward_mean"] <= 2 and r["env_errors"] == 0 and r["turns_max"] == 2

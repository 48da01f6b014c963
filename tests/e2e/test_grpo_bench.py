"""The GRPO benchmark runs end to end with the peers skipped and ends with its JSON line."""

import importlib.util
import json
import subprocess
import sys

import pytest
from paths import BENCHMARKS

from compiler import compile_plan
from locojax.config.compose import compose_config

SCRIPT = BENCHMARKS / "grpo.py"


@pytest.mark.slow
def test_benchmark_reports_json_last(tmp_path):
    # One arm runs: LoRA, whose rate wins over the recipe's (the other arms are overrides on
    # the same path; their settings are checked below without a run).
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--peers", "--speed-steps", "2", "--warmup",
           "1", "--learning-steps", "2", "--seeds", "0", "--out", str(tmp_path),
           "--arms", "lora16"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    speed = report["speed"]
    assert speed["locojax_step_s"] > 0
    assert speed["tunix_step_s"] is None and speed["vs_trl"] is None
    split = speed["details"]["locojax"]
    assert 0 < split["rollout_s"] < split["step_s"] and split["train_s"] > 0
    learning = report["learning"]
    assert 0 <= learning["locojax_final"] <= 1 and learning["trl_final"] is None
    assert len(learning["curves"]["locojax"]) == 1 and len(learning["curves"]["locojax"][0]) == 2
    # The LoRA arm on the same warmed base: its rows, final and settings.
    assert len(learning["curves"]["locojax_lora16"][0]) == 2
    assert 0 <= learning["locojax_lora16_final"] <= 1
    lora = json.loads((tmp_path / "learning" / "seed0" / "lora16" / "locojax" / "plan.json")
                      .read_text())["algorithm"]
    assert lora["lora"]["rank"] == 16
    assert lora["lora"]["learning_rate"] > 5e-4, "the arm's rate wins over the recipe's"
    assert {"locojax_lora64", "locojax_gspo", "locojax_dynamic_sampling"}.isdisjoint(
        learning["curves"])  # not asked for
    assert (tmp_path / "learning" / "grpo_learning.png").stat().st_size > 0
    # The peers' checkpoints carry the tokenizer files they read.
    ckpt = tmp_path / "learning" / "seed0" / "ckpt"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in ckpt.iterdir()}
    assert "jax" in report["versions"]


def test_the_arms_plan_what_they_name():
    """Every arm's overrides on the learning case's recipe compile to the settings it is named
    for (the run above takes one arm through the script)."""
    spec = importlib.util.spec_from_file_location("grpo_bench", SCRIPT)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(BENCHMARKS))
    plans = {arm: compile_plan(compose_config([*bench.LEARN_OVERRIDES, *overrides])).algorithm
             for arm, overrides in bench.ARMS.items()}
    assert plans["dynamic_sampling"].dynamic_sampling == "filter"
    assert plans["lora16"].lora.rank == 16 and plans["lora64"].lora.rank == 64
    assert plans["updates2"].optimizer_steps_per_batch == 2
    gspo = plans["gspo"]
    assert gspo.ratio_level == "sequence" and gspo.clip_eps == 3e-4
    # at one update per batch GSPO is GRPO exactly, so the arm takes two
    assert gspo.optimizer_steps_per_batch == 2

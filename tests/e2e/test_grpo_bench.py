"""The GRPO benchmark runs end to end with the peers skipped and ends with its JSON line."""

import json
import subprocess
import sys

import pytest
from paths import BENCHMARKS

SCRIPT = BENCHMARKS / "grpo.py"


@pytest.mark.slow
def test_benchmark_reports_json_last(tmp_path):
    # Three of the arms (lora64 is lora16's path at another rank).
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--peers", "--speed-steps", "2", "--warmup",
           "1", "--learning-steps", "2", "--seeds", "0", "--out", str(tmp_path),
           "--arms", "dynamic_sampling", "lora16", "gspo"]
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
    # The dynamic-sampling arm: the same prompts and seed, its own curve and final.
    assert len(learning["curves"]["locojax_dynamic_sampling"][0]) == 2
    assert 0 <= learning["locojax_dynamic_sampling_final"] <= 1
    # The LoRA arm on the same warmed base and the GSPO arm: their rows, finals and settings.
    for arm in ("lora16", "gspo"):
        assert len(learning["curves"][f"locojax_{arm}"][0]) == 2
        assert 0 <= learning[f"locojax_{arm}_final"] <= 1
    plans = {arm: json.loads((tmp_path / "learning" / "seed0" / arm / "locojax" / "plan.json")
                             .read_text())["algorithm"] for arm in ("lora16", "gspo")}
    assert plans["lora16"]["lora"]["rank"] == 16
    assert plans["lora16"]["learning_rate"] > 5e-4, "the arm's rate wins over the recipe's"
    assert plans["gspo"]["ratio_level"] == "sequence" and plans["gspo"]["clip_eps"] == 3e-4
    # at one update per batch GSPO is GRPO exactly, so the arm takes two
    assert plans["gspo"]["optimizer_steps_per_batch"] == 2
    assert "locojax_lora64" not in learning["curves"]  # not asked for
    assert (tmp_path / "learning" / "grpo_learning.png").stat().st_size > 0
    # The peers' checkpoints carry the tokenizer files they read.
    ckpt = tmp_path / "learning" / "seed0" / "ckpt"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in ckpt.iterdir()}
    assert "jax" in report["versions"]

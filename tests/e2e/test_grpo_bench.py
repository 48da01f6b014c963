"""The GRPO benchmark runs end to end with the peers skipped and ends with its JSON line."""

import json
import subprocess
import sys

import pytest
from paths import BENCHMARKS

SCRIPT = BENCHMARKS / "grpo.py"


@pytest.mark.slow
def test_benchmark_reports_json_last(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--peers", "--speed-steps", "2", "--warmup",
           "1", "--learning-steps", "2", "--seeds", "0", "--out", str(tmp_path)]
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
    # The LoRA arms (rank 16 and 64) on the same warmed base: their rows and finals.
    for arm in ("locojax_lora16", "locojax_lora64"):
        assert len(learning["curves"][arm][0]) == 2 and 0 <= learning[f"{arm}_final"] <= 1
        plan = json.loads((tmp_path / "learning" / "seed0" / arm.removeprefix("locojax_")
                           / "locojax" / "plan.json").read_text())
        assert plan["algorithm"]["lora"]["rank"] == int(arm[-2:])
        assert plan["algorithm"]["learning_rate"] > 5e-4, "the arm's rate wins over the recipe's"
    assert (tmp_path / "learning" / "grpo_learning.png").stat().st_size > 0
    # The peers' checkpoints carry the tokenizer files they read.
    ckpt = tmp_path / "learning" / "seed0" / "ckpt"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in ckpt.iterdir()}
    assert "jax" in report["versions"]

"""The train-step and old-log-prob benchmarks run end to end at tiny sizes (JSON last)."""

import json
import subprocess
import sys

from paths import BENCHMARKS

SCRIPT = BENCHMARKS / "train_step.py"


def test_benchmark_reports_json_last():
    cmd = [sys.executable, str(SCRIPT), "--tiny", "--runs", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(report) == {"cpu_standard", "qwen3_0_6b_2l", "cpu_standard_lora16",
                           "qwen3_0_6b_2l_lora16"}
    for row in report.values():
        assert {"step_s", "flops", "mfu", "compiled_bytes"} <= set(row)
        assert row["step_s"] > 0 and row["flops"] > 0 and row["mfu"] > 0
        assert row["hw_flops"] >= row["flops"]
        assert row["compiled_flops"] > 0  # the compiled step's dots, loops multiplied out
        assert row["roofline_fraction"] == row["flops"] / row["compiled_flops"]
    for key in ("cpu_standard", "qwen3_0_6b_2l"):  # LoRA trains a small part of the model
        full, lora = report[key], report[f"{key}_lora16"]
        assert lora["lora"]["rank"] == 16 and lora["trainable"] < full["trainable"] / 2


def test_old_logprobs_benchmark_reports_json_last():
    cmd = [sys.executable, str(BENCHMARKS / "old_logprobs.py"), "--tiny", "--runs", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(report["mismatch"]) == {"float32", "bfloat16"}
    assert report["mismatch"]["float32"]["max_abs"] < 1e-3
    # A ratio of two timings: its figure belongs to the benchmark, only its presence here.
    assert report["recompute_over_step"] > 0

"""The rollout benchmark runs end to end (our engine only) and ends with its JSON line."""

import json
import subprocess
import sys

import pytest
from paths import BENCHMARKS

SCRIPT = BENCHMARKS / "rollout.py"


@pytest.mark.slow
def test_benchmark_reports_every_case_in_its_json_line():
    """The standard, grouped and variable-length cases in one run at vocab 8,192 (the cases'
    default is 151,936) and plumbing size (`--smoke`): the pipeline, not the figures."""
    cmd = [sys.executable, str(SCRIPT), "--vocab", "8192", "--runs", "1", "--peers",
           "--cases", "standard", "grouped", "variable_length", "--smoke"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    row = report["vocab_8192"]
    assert row["locojax"] > 0 and row["hf"] is None and row["tunix"] is None
    assert row["roofline_fraction"] > 0  # its size is a timing: benchmarks/ reports it
    assert row["compile_s"] >= 0
    # Both of our paths are timed; the kernel's only where it can be built.
    times = row["details"]["locojax"]["times_s"]
    assert "xla ops" in times and len(times["xla ops"]) == 1
    assert ("cpu kernels" in times) == (row["kernel_build_s"] is not None)
    grouped, variable = report["grouped"], report["variable_length"]
    assert {"shared_prefill_s", "repeated_prefill_s", "prefill_speedup", "locojax", "hf",
            "tunix"} <= set(grouped)
    # Two timings: which is faster is the benchmark's figure, not this test's.
    assert grouped["shared_prefill_s"] > 0 and grouped["repeated_prefill_s"] > 0
    assert {"refill", "static", "speedup", "mean_length"} <= set(variable)
    assert 1 < variable["mean_length"] < 32 and variable["refill"] > 0
    # The same rows under both schedules: refill leaves fewer slot-steps idle.
    assert variable["idle_share"]["refill"] < variable["idle_share"]["static"]


@pytest.mark.slow
def test_accelerator_benchmark_runs_every_part_at_tiny_size_on_cpu():
    """benchmarks/accelerator.py --tiny: decode, prefill, train and a CO run, each figure
    beside its limit from conf/hardware (the plumbing; the chip's figures are the script's)."""
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "accelerator.py"), "--tiny"],
                          capture_output=True, text=True, timeout=900, check=True)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["hardware"] == "cpu" and report["hbm_bytes_per_s"] > 0
    decode = report["tiny/decode"]
    row = decode["decode_kernels_auto"]
    assert row["ms_per_step"] > 0 and row["decode_steps"] > 0 and row["weight_bytes"] > 0
    assert row["roofline_fraction"] == pytest.approx(row["roofline_ms"] / row["ms_per_step"],
                                                     abs=1e-3)
    assert decode["prefill_kernels_auto"]["mfu"] > 0 and decode["slots"] >= 1
    for name in ("full_fused_off", "lora_fused_off"):
        assert report["tiny/train"][name]["mfu"] > 0
    co = report["tiny/co"]
    assert co["steps"] == 2 and co["compiles_after_step_1"] == 0
    for phase in ("rollout_s", "train_s", "step_s"):
        assert co[phase]["measured"] > 0 and co[phase]["plan"] > 0
    assert 0 <= co["host_share"]["measured"] < 1

"""The rollout benchmark runs end to end (our engine only) and ends with its JSON line."""

import json
import subprocess
import sys

import pytest
from paths import BENCHMARKS

SCRIPT = BENCHMARKS / "rollout.py"


@pytest.mark.slow
def test_benchmark_reports_json_last():
    cmd = [sys.executable, str(SCRIPT), "--vocab", "8192", "--runs", "1", "--peers"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    row = report["vocab_8192"]
    assert row["locojax"] > 0 and row["hf"] is None and row["tunix"] is None
    assert 0 < row["roofline_fraction"] < 1.5
    assert row["compile_s"] >= 0
    # Both of our paths are timed; the kernel's only where it can be built.
    times = row["details"]["locojax"]["times_s"]
    assert "xla ops" in times and len(times["xla ops"]) == 1
    assert ("cpu kernels" in times) == (row["kernel_build_s"] is not None)

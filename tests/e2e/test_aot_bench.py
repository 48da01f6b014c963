"""The TPU-compiler characterization runs its cheapest case end to end (JSON last): every
program of the plan compiled in its own child process, measured, beside the plan's figures."""

import importlib.util
import json
import subprocess
import sys

import pytest
from paths import BENCHMARKS, ROOT

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="the tpu extra (libtpu) is not installed")


@needs_libtpu
def test_aot_benchmark_quick_case_reports_json_last():
    cmd = [sys.executable, str(BENCHMARKS / "aot.py"), "--quick", "--timeout-s", "600"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    (name, case), = report["cases"].items()
    assert name == "quick-v5e-4-2layers" and case["status"] == "compiled", case
    assert case["topology"] == "v5e:2x2" and case["devices"] == 4
    programs = case["programs"]
    # one host trains: CO's reshard is a program of its own
    assert set(programs) == {"train_step", "rollout_prefill", "rollout_slots", "reshard"}
    for prog, row in programs.items():
        assert row["fits"] and 0 < row["compiler_bytes"] <= row["device_hbm_bytes"], prog
        assert row["plan_bytes"] > 0 and row["compile_cpu_s"] > 0, prog
        assert row["peak_rss_bytes"] > 100 * 2**20 and not row["over_10_cpu_min"], prog
    # the train step's ceiling can pass 1 here: 6 x params x tokens counts the head on every
    # column, the trainer runs it on the response columns only (the head is most of 2 layers)
    assert programs["train_step"]["ceiling"] > 0 and programs["train_step"]["flops"] > 0
    assert 0 < programs["rollout_slots"]["ceiling"] <= 1
    # the cases not selected are listed, not dropped
    assert "gsm8k-v7x-8" in report["not_run"] and len(report["not_run"]) > 20
    assert "train_step" in proc.stdout.splitlines()[2]  # the table prints as it goes

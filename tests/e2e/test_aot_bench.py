"""The TPU-compiler characterization runs its cheapest case end to end (JSON last): every
program of the plan compiled in its own child process, measured, beside the plan's figures."""

import importlib.util
import json
import subprocess
import sys

import pytest
from paths import BENCHMARKS, ROOT

from compiler import compile_plan
from locojax.aot.programs import reshard_is_a_program
from locojax.config.compose import compose_config

pytestmark = pytest.mark.tpu

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="the tpu extra (libtpu) is not installed")


@needs_libtpu
def test_aot_benchmark_smoke_case_reports_json_last():
    # The tiny model's widths: the script's plumbing end to end (its real cases run by hand;
    # the 2-layer Qwen3-0.6B programs are tests/e2e/test_aot_tpu.py's).
    cmd = [sys.executable, str(BENCHMARKS / "aot.py"), "--smoke", "--timeout-s", "600"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    (name, case), = report["cases"].items()
    assert name == "smoke-v5e-4-tiny" and case["status"] == "compiled", case
    assert case["topology"] == "v5e:2x2" and case["devices"] == 4
    programs = case["programs"]
    # CO's reshard is compiled only where the plan has one (one training host)
    plan = compile_plan(compose_config(case["overrides"]))
    assert {"train_step", "rollout_prefill", "rollout_slots"} <= set(programs) <= {
        "train_step", "rollout_prefill", "rollout_slots",
        *(["reshard"] if reshard_is_a_program(plan) else [])}
    for prog, row in programs.items():
        assert row["fits"] and 0 < row["compiler_bytes"] <= row["device_hbm_bytes"], prog
        assert row["plan_bytes"] > 0 and row["compile_cpu_s"] > 0, prog
        assert row["peak_rss_bytes"] > 100 * 2**20 and "over_10_cpu_min" in row, prog
    assert 0 < programs["train_step"]["ceiling"] <= 1 and programs["train_step"]["flops"] > 0
    assert 0 < programs["rollout_slots"]["ceiling"] <= 1
    # one case: the fit of each efficiency is its ceiling
    assert report["fits"] == {"v5e": {
        "train_efficiency": round(programs["train_step"]["ceiling"], 4),
        "decode_efficiency": round(programs["rollout_slots"]["ceiling"], 4)}}
    # the cases not selected are listed, not dropped
    assert "gsm8k-v7x-8" in report["not_run"] and len(report["not_run"]) > 20
    assert "train_step" in proc.stdout.splitlines()[2]  # the table prints as it goes

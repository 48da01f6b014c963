"""The compile benchmark runs end to end and ends with its JSON line (speed is its figure)."""

import json
import subprocess
import sys

from paths import BENCHMARKS, ROOT


def test_compile_benchmark_reports_json_last():
    cmd = [sys.executable, str(BENCHMARKS / "compile.py"), "--repeats", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True, cwd=ROOT)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(report["compile_s"]) == set(report["first_compile_s"]) == {
        "colocated", "disaggregated", "auto"}
    assert all(s > 0 for s in [*report["compile_s"].values(), *report["round_trip_s"].values()])
    assert report["hosts"] == 128 and report["params"] > 400e9

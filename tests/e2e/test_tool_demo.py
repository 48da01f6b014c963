"""The tool demo's benchmark (`benchmarks/tool_demo.py`) end to end at smoke size: the
`arith_tools_co` run (its warm-up on the reference episodes, then GRPO with the `add` tool in
a worker) and the same run without the tool, their figures (JSON last) and the plot."""

import json
import subprocess
import sys

from paths import BENCHMARKS


def test_the_demo_and_the_run_without_the_tool_report_json_last(tmp_path):
    png = tmp_path / "curves.png"
    cmd = [sys.executable, str(BENCHMARKS / "tool_demo.py"), "--steps", "2", "--keep",
           str(tmp_path), "--png", str(png), "algorithm.sft_warmup_steps=2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("tools", "no_tool"):
        assert {"first", "last10", "rise", "accuracy_last10", "wall_s"} <= set(report[name])
        assert 0 <= report[name]["last10"] <= 1 + 1e-6 and report[name]["wall_s"] > 0
    assert report["gap"] == report["tools"]["last10"] - report["no_tool"]["last10"]
    assert {"rise_ok", "gap_ok"} <= set(report) and png.stat().st_size > 0
    plans = {n: json.loads((tmp_path / n / "plan.json").read_text())["workload"]
             for n in ("tools", "no_tool")}
    assert plans["tools"]["tools"] == {"add": "locojax.envs.calculator:add"}
    assert plans["tools"]["max_turns"] == 2
    assert plans["no_tool"]["tools"] == {} and plans["no_tool"]["max_turns"] == 1
    rows = [json.loads(x) for x in (tmp_path / "tools" / "metrics.jsonl").read_text()
            .splitlines()]
    assert len(rows) == 2 and all(r["turns_mean"] >= 1 for r in rows)

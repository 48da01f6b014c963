"""A `-m` sweep compiles every job's plan before running any: each invalid job is one line and
the sweep exits 2 with no job run; a job that fails while the sweep runs ends it non-zero and
the sweep's table keeps the jobs that ran; `~model` names the deleted group (issue 28 item 6).
"""

import csv
import subprocess
import sys

import pytest
from shared_runs import run_env

pytestmark = pytest.mark.slow


def _run(tmp_path, module: str, *args: str) -> tuple[int, list[str], str]:
    out = subprocess.run([sys.executable, "-m", module, *args,
                          f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env=run_env())
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    return out.returncode, lines, out.stdout + out.stderr


def test_a_plan_sweep_reports_every_invalid_job_and_runs_none(tmp_path):
    code, lines, text = _run(tmp_path, "locojax.plan", "-m", "+experiment=arith_co",
                             "mesh=cpu", "run.steps=3,-1", "workload.group_size=4,1")
    assert code == 2, text[-3000:]
    assert len(lines) == 3, lines  # every job but (3, 4), each once
    assert all(x.startswith("error: job ") for x in lines), lines
    # in the sweep's order (run.steps outer); a job's first fault is its line
    assert "run.steps=3 workload.group_size=1: workload.group_size=1: must be >=" in lines[0]
    assert "run.steps=-1 workload.group_size=4: run.steps=-1: must be >= 0" in lines[1]
    assert "run.steps=-1 workload.group_size=1:" in lines[2], lines
    assert "Traceback" not in text and not (tmp_path / "sweep").exists()


def test_a_run_sweep_with_an_invalid_last_job_trains_no_job(tmp_path):
    code, lines, text = _run(tmp_path, "locojax", "-m", "+experiment=arith_co",
                             "algorithm.sft_warmup_steps=0", "run.eval_every=0",
                             "run.steps=1,-1")
    assert code == 2, text[-3000:]
    assert len(lines) == 1 and "run.steps=-1: must be >= 0" in lines[0], lines
    assert "Traceback" not in text and not (tmp_path / "sweep").exists()


def test_a_job_failing_while_the_sweep_runs_keeps_the_jobs_that_ran(tmp_path):
    # Both compile; the second reads a data directory that does not exist (found when it runs).
    code, lines, text = _run(tmp_path, "locojax", "-m", "+experiment=arith_co,gsm8k_co",
                             "model=tiny", "workload.data_dir=/nonexistent",
                             "algorithm.sft_warmup_steps=0", "run.eval_every=0", "run.steps=1",
                             "run.checkpoint_every=0")
    assert code == 2, text[-3000:]
    assert "/nonexistent" in lines[-1] and "Traceback" not in text, lines
    rows = list(csv.DictReader((tmp_path / "sweep" / "runs.csv").open()))
    assert len(rows) == 1 and "arith_co" in rows[0]["overrides"], rows


def test_deleting_a_required_group_names_it(tmp_path):
    code, lines, text = _run(tmp_path, "locojax.plan", "+experiment=arith_co", "~model")
    assert code == 2 and len(lines) == 1, text[-3000:]
    assert lines[0].startswith("error: ~model: model is required"), lines

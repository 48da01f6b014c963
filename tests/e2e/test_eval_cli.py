"""`python -m locojax.eval`: k samples per prompt of a run's exported policy, scored; the last
stdout line is the summary, whose pass@k is the unbiased estimator of the rows it wrote."""

import json
import shutil
import subprocess
import sys
from math import comb
from pathlib import Path

import pytest
import warm
from paths import ROOT
from shared_runs import run_env, shared_run


def _run(*overrides: str) -> subprocess.CompletedProcess:
    env = run_env()
    return warm.run([sys.executable, "-m", "locojax.eval", *overrides],
                    capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory) -> Path:
    """A run trained once per session (`shared_run`: whichever xdist worker asks first; it was
    module-scoped, so each worker that took one of these tests trained it again). Its one step
    evaluates in the run with 3 samples a prompt (test_in_run_evaluation_...). Read it."""
    return shared_run(tmp_path_factory, "eval_k3", "+experiment=arith_co",
                      "algorithm.sft_warmup_steps=20", "run.steps=1", "run.eval_every=1",
                      "run.eval_samples=3", "run.checkpoint_every=0")


def test_greedy_default_is_one_sample(run_dir, tmp_path):
    """An HF directory with `model=hf`: the numbers come from eval.checkpoint's config.json
    (it failed on model=hf's zeros)."""
    out = _run("+experiment=arith_co", f"eval.checkpoint={run_dir / 'hf'}", "model=hf",
               "eval.prompts=8", f"eval.out={tmp_path}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    # one greedy completion: its accuracy, under its own key (pass@1 is the sampled estimate)
    assert summary["samples"] == 1 and "greedy_accuracy" in summary
    assert not {"pass@1", "maj@1"} & set(summary)
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert summary["greedy_accuracy"] == pytest.approx(sum(r["correct"][0] for r in rows) / 8)


def test_a_missing_checkpoint_is_one_line(tmp_path):
    out = _run("+experiment=arith_co", f"eval.checkpoint={tmp_path}")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "eval.checkpoint" in lines[0], lines


def test_a_run_directory_without_checkpoint_or_export_is_one_line(run_dir, tmp_path):
    shutil.copy(run_dir / "plan.json", tmp_path / "plan.json")
    out = _run("+experiment=arith_co", f"eval.checkpoint={tmp_path}")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "neither a checkpoint" in lines[0], lines
    # a damaged plan.json beside a checkpoint: one line naming it, no traceback
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "checkpoints" / "1").mkdir(parents=True)
    out = _run("+experiment=arith_co", f"eval.checkpoint={tmp_path}")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(f"error: {tmp_path / 'plan.json'}: not a plan LoCoJAX wrote")


def test_in_run_evaluation_with_k_samples(run_dir):
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"eval_pass@1", "eval_pass@3", "eval_maj@3", "eval_s"} <= set(row)
    assert "eval_greedy_accuracy" not in row
    assert row["eval_pass@1"] <= row["eval_pass@3"]


def test_pass_at_k_is_the_estimator_of_the_rows_from_a_checkpoint_an_export_or_two_hosts(
        run_dir, tmp_path):
    """k = 3 samples of 12 prompts, three ways: the export on one host, and a copy of the run
    stopped before its export (its final step restores the weights the export holds) on one
    host and on two (each prompt sampled once, by one host): the same completions, token for
    token, and the same summary, whose pass@k is the unbiased estimator of the rows (by hand:
    with n = k, pass@k of a prompt is 1 when any of its k is right)."""
    k, prompts = 3, 12
    stopped = tmp_path / "stopped"
    shutil.copytree(run_dir, stopped, ignore=shutil.ignore_patterns("hf", "eval"))
    common = ["+experiment=arith_co", f"eval.samples={k}", f"eval.prompts={prompts}",
              "sampling.temperature=1.0", "mesh=cpu"]
    got = {}
    for name, checkpoint, hosts in (("hf", run_dir / "hf", 1), ("step", stopped, 1),
                                    ("two", stopped, 2)):
        out = _run(*common, f"eval.checkpoint={checkpoint}", f"mesh.hosts={hosts}",
                   f"eval.out={tmp_path / name}")
        assert out.returncode == 0, out.stderr[-3000:]
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        assert summary.pop("hosts") == hosts
        assert json.loads((tmp_path / name / "summary.json").read_text())["hosts"] == hosts
        rows = [json.loads(x) for x in (tmp_path / name / "samples.jsonl").read_text()
                .splitlines()]
        got[name] = summary, rows
    (hf, rows), (two, two_rows), (step, step_rows) = got["hf"], got["two"], got["step"]
    assert {"pass@1", f"pass@{k}", f"maj@{k}", "mean_length", "truncation_rate"} <= set(hf)
    assert len(rows) == prompts and all(len(r["completions"]) == k for r in rows)
    counts = [sum(r["correct"]) for r in rows]
    assert 0 < sum(counts) < prompts * k, counts  # the estimator is tested off its ends
    assert hf[f"pass@{k}"] == pytest.approx(sum(c > 0 for c in counts) / prompts)
    assert hf["pass@1"] == pytest.approx(sum(counts) / (prompts * k))
    assert hf[f"pass@{k}"] == pytest.approx(
        sum(1 - comb(k - c, k) / comb(k, k) for c in counts) / prompts)
    # two hosts: the same completions, whichever host drew them, every prompt once
    assert two == step
    assert [r["completions"] for r in two_rows] == [r["completions"] for r in step_rows]
    by_host = {h: [i for i, r in enumerate(two_rows) if r["host"] == h] for h in (0, 1)}
    assert by_host[0] and by_host[1] and not set(by_host[0]) & set(by_host[1])
    assert sorted(by_host[0] + by_host[1]) == list(range(prompts))
    assert {r["host"] for r in rows} == {0}
    # the run without its export: its final step, the export's weights
    assert step.pop("step") == 1 and "step" not in hf  # the fixture's one step, the latest
    assert step.pop("checkpoint") == str(stopped / "checkpoints" / "1")
    hf.pop("checkpoint")
    assert step == hf and step_rows == rows

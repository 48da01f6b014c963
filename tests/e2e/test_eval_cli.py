"""`python -m locojax.eval`: k samples per prompt of a run's exported policy, scored; the last
stdout line is the summary, whose pass@k is the unbiased estimator of the rows it wrote."""

import json
import shutil
import subprocess
import sys
from math import comb
from pathlib import Path

import pytest
from paths import ROOT
from shared_runs import run_env, shared_run


def _run(*overrides: str) -> subprocess.CompletedProcess:
    env = run_env()
    return subprocess.run([sys.executable, "-m", "locojax.eval", *overrides],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory) -> Path:
    """A run trained once per session (`shared_run`: whichever xdist worker asks first; it was
    module-scoped, so each worker that took one of these tests trained it again). Its one step
    evaluates in the run with 3 samples a prompt (test_in_run_evaluation_...). Read it."""
    return shared_run(tmp_path_factory, "eval_k3", "+experiment=arith_co",
                      "algorithm.sft_warmup_steps=20", "run.steps=1", "run.eval_every=1",
                      "run.eval_samples=3", "run.checkpoint_every=0")


def test_pass_at_k_of_a_run_directory_matches_its_rows(run_dir, tmp_path):
    k = 4
    out = _run("+experiment=arith_co", f"eval.checkpoint={run_dir}", f"eval.samples={k}",
               "eval.prompts=12", "sampling.temperature=1.0", f"eval.out={tmp_path}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"pass@1", f"pass@{k}", f"maj@{k}", "mean_length", "truncation_rate"} <= set(summary)
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(len(r["completions"]) == k for r in rows)
    counts = [sum(r["correct"]) for r in rows]
    # by hand: with n = k, pass@k of a prompt is 1 when any of its k is right
    assert summary[f"pass@{k}"] == pytest.approx(sum(c > 0 for c in counts) / 12)
    assert summary["pass@1"] == pytest.approx(sum(counts) / (12 * k))
    assert summary[f"pass@{k}"] == pytest.approx(
        sum(1 - comb(k - c, k) / comb(k, k) for c in counts) / 12)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary


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


def test_a_run_without_its_export_is_evaluated_at_its_final_step(run_dir, tmp_path):
    # a run stopped before its export: checkpoints, no hf/; its final step restores the
    # weights the export holds, so the sampled completions are the export's, token for token
    stopped = tmp_path / "stopped"
    shutil.copytree(run_dir, stopped, ignore=shutil.ignore_patterns("hf", "eval"))
    common = ["+experiment=arith_co", "eval.samples=3", "eval.prompts=8",
              "sampling.temperature=1.0"]
    got = {}
    for name, checkpoint in (("step", stopped), ("hf", run_dir / "hf")):
        out = _run(*common, f"eval.checkpoint={checkpoint}", f"eval.out={tmp_path / name}")
        assert out.returncode == 0, out.stderr[-3000:]
        got[name] = json.loads(out.stdout.strip().splitlines()[-1])
    step, hf = got["step"], got["hf"]
    assert step.pop("step") == 1 and "step" not in hf  # the fixture's one step, the latest
    assert step.pop("checkpoint") == str(stopped / "checkpoints" / "1")
    hf.pop("checkpoint")
    assert step == hf
    assert (tmp_path / "step" / "samples.jsonl").read_text() == \
        (tmp_path / "hf" / "samples.jsonl").read_text()


def test_a_run_directory_without_checkpoint_or_export_is_one_line(run_dir, tmp_path):
    shutil.copy(run_dir / "plan.json", tmp_path / "plan.json")
    out = _run("+experiment=arith_co", f"eval.checkpoint={tmp_path}")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "neither a checkpoint" in lines[0], lines


def test_in_run_evaluation_with_k_samples(run_dir):
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"eval_pass@1", "eval_pass@3", "eval_maj@3", "eval_s"} <= set(row)
    assert "eval_greedy_accuracy" not in row
    assert row["eval_pass@1"] <= row["eval_pass@3"]


def test_two_hosts_share_the_prompts_and_give_the_one_host_summary(run_dir, tmp_path):
    common = ["+experiment=arith_co", f"eval.checkpoint={run_dir}", "eval.samples=3",
              "eval.prompts=12", "sampling.temperature=1.0", "mesh=cpu"]
    got = {}
    for hosts in (1, 2):
        out = _run(*common, f"mesh.hosts={hosts}", f"eval.out={tmp_path / str(hosts)}")
        assert out.returncode == 0, out.stderr[-3000:]
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        assert summary.pop("hosts") == hosts
        rows = [json.loads(x) for x in (tmp_path / str(hosts) / "samples.jsonl").read_text()
                .splitlines()]
        got[hosts] = summary, rows
    (one, one_rows), (two, two_rows) = got[1], got[2]
    assert two == one  # the same completions, whichever host drew them
    assert [r["completions"] for r in two_rows] == [r["completions"] for r in one_rows]
    by_host = {h: [i for i, r in enumerate(two_rows) if r["host"] == h] for h in (0, 1)}
    assert by_host[0] and by_host[1] and not set(by_host[0]) & set(by_host[1])
    assert sorted(by_host[0] + by_host[1]) == list(range(12))  # every prompt once
    assert {r["host"] for r in one_rows} == {0}

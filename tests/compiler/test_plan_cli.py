"""`mesh.chips=0`, the placement=auto ranking and the plan sweep summary (issue 5, items 2-4)."""

import csv
import functools
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT
from rich.console import Console

from compiler import compile_plan, plan_to_json
from compiler.cost.characterize import smallest_plan
from compiler.hardware import min_chips_for_training
from compiler.pipeline import predicted_step_s
from locojax.config.compose import compose_config
from locojax.reports.plan_sweep import _label_rows, plan_row, sweep_table
from locojax.reports.plan_view import human_bytes, print_plan

REPO = ROOT
MODELS = ("qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_8b", "qwen3_14b", "qwen3_32b",
          "llama3_70b", "llama3_405b")
SINGLE_FIT = ["+experiment=gsm8k_co", "controller=single", "mesh=v7x", "mesh.chips=0",
              "algorithm.optimizer_steps_per_batch=1"]  # the calibration: one update


@functools.cache
def _plan(*overrides: str):
    return compile_plan(compose_config(list(overrides)))


@functools.cache
def _row(*overrides: str) -> dict:

    return plan_row(_plan(*overrides), list(overrides))


def test_chips_0_picks_the_smallest_multi_host_machine_that_compiles():
    for model in ("qwen3_0_6b", "llama3_70b", "llama3_405b"):
        plan = _plan(*SINGLE_FIT, f"model={model}")
        cfg = compose_config([*SINGLE_FIT, f"model={model}"])
        assert plan.topology.chips_from == "memory_fit"
        assert plan.topology.hosts >= 2
        assert plan.topology.chips >= min_chips_for_training(cfg.model, cfg.hardware,
                                                             cfg.algorithm)
        same = smallest_plan(cfg.model, cfg.hardware, cfg.workload, algorithm=cfg.algorithm)
        assert same.topology.chips == plan.topology.chips
    assert _plan(*SINGLE_FIT, "model=qwen3_0_6b").topology.chips == 8
    # 405B at 64 chips, the fewest that hold its training state: the rollout's whole prompt KV
    # store (384 prompts x 256 tokens, replicated over tensor since 8 kv heads do not split
    # 128 ways) would leave no slot beside the weights; a store of 96 prompts at a time,
    # refilled three times inside the slot loop, leaves 27.
    big = _plan(*SINGLE_FIT, "model=llama3_405b")
    assert big.topology.chips == 64
    assert (big.batch.prompt_store_rows, big.batch.prompt_store_refills) == (96, 3)
    assert big.batch.slots == 27
    # 70B at 16 chips (32 devices): FSDP over all of them leaves 35 GB of fp32 state per
    # device; the rollout (17.6 GB of tensor-8 weights, the prompt KV store of 96 prompts and
    # 768 slots) takes 55 GB of the 58 GB left beside it, and the train step 84 GB of its
    # 93 GB once the rollout copy is dropped. At 8 chips the rollout weights do not fit beside
    # the state (11.3 GB a device even at tensor 16, over the 11.1 GB left):
    # the compile decides.
    assert _plan(*SINGLE_FIT, "model=llama3_70b").topology.chips == 16
    given = _plan("+experiment=gsm8k_co", "mesh=v7x")
    assert (given.topology.chips, given.topology.chips_from) == (8, "config")


def test_single_controller_shares_per_model_size():
    rows = [_row(*SINGLE_FIT, f"model={m}") for m in MODELS]
    host = [r["single_host_share"] for r in rows]
    assert 0.30 <= host[0] <= 0.42
    # Falls with size on the Qwen3 models' common 8-chip machine, and to the lowest at 405B:
    # 405B's fitted machine has 4x the hosts of 70B's, but v7x launches through a tree of
    # hosts (5 rounds vs 3) while the step doubles. (70B's FSDP group spans 4 hosts, so its
    # share may sit above 32B's.)
    qwen = host[:6]
    assert qwen == sorted(qwen, reverse=True) and host[-1] == min(host) and host[-1] < 0.01
    for r in rows:
        parts = [r[f"single_{k}_share"] for k in ("compute", "host", "network", "transfer")]
        assert sum(parts) == pytest.approx(1.0)


def test_co_beats_single_by_the_papers_factors_for_gsm8k():
    rows = {c: _row("+experiment=gsm8k_co", "mesh=v7x", f"mesh.chips={c}")
            for c in (8, 16, 32, 64)}
    for r in rows.values():
        assert r["speedup"] == pytest.approx(r["single_step_s"] / r["co_step_s"])
        assert r["speedup"] > 1.0
    speed = [rows[c]["speedup"] for c in (8, 16, 32, 64)]
    assert speed == sorted(speed)
    # At least the paper's 1.3x everywhere (beyond its 3.6x at 32-64 chips: docs/cost-model.md
    # says why), and the paper's "CO on 8 chips beats the single controller on 64".
    assert speed[0] >= 1.3
    assert rows[8]["co_step_s"] < rows[64]["single_step_s"]


def test_numina_da_at_256_chips_ranks_fraction_0_75_best():
    steps = {f: _row("+experiment=numina_da", "mesh=v7x", "mesh.chips=256",
                     f"placement.rollout_fraction={f}")["da_step_s"] for f in (0.25, 0.5, 0.75)}
    assert steps[0.75] < steps[0.5] < steps[0.25]


def test_auto_records_every_candidate_fastest_first():
    plan = _plan("+experiment=numina_da", "mesh=v7x", "mesh.chips=256", "placement=auto")
    ranking = plan.placement_candidates
    assert [c.chosen for c in ranking] == [True, False, False, False]
    assert {(c.mode, c.rollout_fraction) for c in ranking} == {
        ("colocated", 1.0), ("disaggregated", 0.25), ("disaggregated", 0.5),
        ("disaggregated", 0.75)}
    assert [c.step_s for c in ranking] == sorted(c.step_s for c in ranking)
    assert ranking[0].step_s == predicted_step_s(plan)
    assert ranking[0].mode == plan.placement.mode
    assert not _plan("+experiment=numina_da", "mesh=v7x", "mesh.chips=256").placement_candidates


def test_sweep_labels_are_the_varying_override():
    rows = [{"overrides": f"+experiment=gsm8k_co model={m}"} for m in ("qwen3_4b", "qwen3_8b")]
    assert _label_rows(rows) == ["qwen3_4b", "qwen3_8b"]
    rows = [{"overrides": f"mesh.chips={c} workload={w}"} for c, w in ((8, "arith"), (16, "x"))]
    assert _label_rows(rows) == ["chips=8 workload=arith", "chips=16 workload=x"]
    table = sweep_table([_row(*SINGLE_FIT, "model=qwen3_0_6b")], "plan")
    assert table.row_count == 1 and "memory fit" in str(table.caption)


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "locojax.plan", *args,
                           f"hydra.sweep.dir={tmp_path}"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_cli_characterization_sweep_writes_csv_png_and_table(tmp_path):
    out = _cli(tmp_path, "-m", *SINGLE_FIT, "model=qwen3_0_6b,llama3_405b")
    assert out.returncode == 0, out.stderr
    assert "qwen3_0_6b" in out.stdout and "llama3_405b" in out.stdout
    assert "36.00%" in out.stdout  # the calibrated host share of the 0.6B row
    rows = list(csv.DictReader((tmp_path / "plans.csv").open()))
    assert [r["model"] for r in rows] == ["qwen3_0_6b", "llama3_405b"]
    assert [r["chips"] for r in rows] == ["8", "64"]
    assert {r["chips_from"] for r in rows} == {"memory_fit"}
    assert (tmp_path / "plans.png").stat().st_size > 10_000


def test_cli_auto_prints_the_ranking(tmp_path):
    out = _cli(tmp_path, "+experiment=gsm8k_co", "mesh=v7x", "mesh.chips=64", "placement=auto")
    assert out.returncode == 0, out.stderr
    assert "placement=auto: candidates" in out.stdout
    assert "fastest predicted step" in out.stdout and "x the chosen step" in out.stdout


def test_plan_view_prints_byte_counts_in_units_and_json_keeps_bytes():
    plan = _plan("+experiment=arith_co", "mesh=cpu")  # its warm-up: sft_* rows too
    out = io.StringIO()
    print_plan(plan, Console(file=out, width=200))
    cells = (line.split("│") for line in out.getvalue().splitlines())
    shown = {c[1].strip(): c[2].strip() for c in cells if len(c) == 4}
    b = plan.batch
    for name in ("train_step_bytes_per_device", "sft_step_bytes_per_device",
                 "rollout_bytes_per_device", "kv_bytes_per_sequence", "activation_bytes_per_row"):
        value = getattr(b, name)
        assert value > 1024 and shown[name] == human_bytes(value), shown[name]
        assert shown[name].endswith(("KiB", "MiB", "GiB"))
        assert json.loads(plan_to_json(plan))["batch"][name] == value  # bytes, unrounded
    assert shown["sft_micro_batches"] == str(b.sft_micro_batches)


def test_plan_view_says_which_objective_ratio_level_sequence_chose():
    cases = (((), "ppo_clip, ratio per token, clip [1-0.2, 1+0.28], token_mean"),
             (("algorithm.ratio_level=sequence",),
              "ratio per sequence, clip [1-0.0003, 1+0.0004], sequence_mean"))
    for extra, said in cases:
        out = io.StringIO()
        print_plan(_plan("+experiment=gsm8k_co", "mesh=v7x", "mesh.chips=64", *extra),
                   Console(file=out, width=300))
        line = next(x for x in out.getvalue().splitlines() if "objective" in x)
        assert said in line and "dual clip 3" in line
        assert "rollout correction tis (cap 2)" in line


def test_plan_view_names_the_policy_loss():
    out = io.StringIO()
    print_plan(_plan("+experiment=gsm8k_co", "mesh=v7x", "mesh.chips=64", "algorithm.loss=cispo",
                     "algorithm.dual_clip=0"), Console(file=out, width=300))
    line = next(x for x in out.getvalue().splitlines() if "objective" in x)
    assert "cispo, ratio per token, clip [1-0.2, 1+0.28]" in line and "dual clip" not in line

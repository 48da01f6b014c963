"""Calibration: the fit recovers known constants; the CLI writes an entry that composes."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import pytest
from paths import FIXTURES

from compiler import DetectedTopology, compile_plan, plan_from_json
from compiler.config import (
    Config,
    ControllerConfig,
    ControllerKind,
    DType,
    HardwareSpec,
    MeshConfig,
    MeshKind,
    ModelConfig,
    TokenizerKind,
    WorkloadConfig,
)
from compiler.cost.fit import (
    PhaseTimes,
    fit_constants,
    fit_runs,
    measured_phases,
    predicted_phases,
)
from locojax import calibrate
from locojax.config.compose import CONF_DIR, compose_config

FIXTURE = FIXTURES / "calib_run"
FITTED = ("decode_efficiency", "prefill_efficiency", "train_efficiency", "detok_s_per_token",
          "score_gsm8k_s_per_sample", "encode_s_per_token", "network_efficiency")
"""Constants a CO run of a GSM8K-scored workload informs (no dispatch round trips)."""


def _rows(t: PhaseTimes, steps: int = 5, dispatches: int = 0) -> list[dict]:
    """metrics.jsonl rows whose phases are `t`, after a slow first (compile) step."""
    row = {"rollout_s": t.rollout, "host_detok_s": t.detok, "host_score_s": t.score,
           "host_batch_s": t.batch, "host_gather_s": 0.5 * t.gather,
           "host_scatter_s": 0.5 * t.gather, "host_dispatch_s": t.dispatch,
           "train_s": t.train, "transfer_s": t.transfer, "step_s": t.step}
    first = {k: 100 * v for k, v in row.items()}
    return [first] + [dict(row, host_dispatches=dispatches) for _ in range(steps)]


NO_CHAT = WorkloadConfig(chat_template=False)
"""The char tokenizer's workload: no chat tokens to wrap prompts in."""


def _two_host_plan_config() -> Config:
    model = ModelConfig(hidden=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                        ffn=384, vocab=32, dtype=DType.float32, tokenizer=TokenizerKind.char)
    return Config(model=model, workload=NO_CHAT,
                  mesh=MeshConfig(kind=MeshKind.cpu, hosts=2, devices_per_host=2),
                  hardware=HardwareSpec(peak_flops_fp32=3.15e11, hbm_bytes=2**34,
                                        hbm_bytes_per_s=3.1e10, ici_bytes_per_s=2.4e10,
                                        dcn_bytes_per_s=2e9, host_cores=2))


def _two_host_plan():
    return compile_plan(_two_host_plan_config())


@pytest.mark.parametrize("plan_source", ["fixture", "two_hosts"])
def test_fit_recovers_known_constants(plan_source):
    plan = (plan_from_json((FIXTURE / "plan.json").read_text()) if plan_source == "fixture"
            else _two_host_plan())
    start = plan.topology.hardware.cost
    # Decode and prefill are fitted as one factor, so the truth keeps their ratio.
    truth = replace(start, decode_efficiency=start.decode_efficiency / 7,
                    prefill_efficiency=start.prefill_efficiency / 7, train_efficiency=0.08,
                    detok_s_per_token=4e-6, score_gsm8k_s_per_sample=2e-5,
                    encode_s_per_token=5e-6, network_efficiency=0.3)
    measured = measured_phases(_rows(predicted_phases(plan, truth)))
    fit = fit_constants(plan, measured, start)
    fitted = [n for n in FITTED if not any(n in note for note in fit.notes)]
    assert "train_efficiency" in fitted and "decode_efficiency" in fitted
    if plan_source == "two_hosts":
        assert predicted_phases(plan, truth).transfer > 0
        assert fitted == list(FITTED)
    for name in fitted:
        assert getattr(fit.constants, name) == pytest.approx(getattr(truth, name), rel=1e-6)
    for phase in ("rollout", "detok", "score", "batch", "train", "step"):
        assert getattr(fit.after, phase) == pytest.approx(getattr(measured, phase), rel=1e-6)
    assert fit.before.train != pytest.approx(measured.train, rel=0.1)
    # A CO run has no round trips to fit dispatch_s on, and no boxed answers to score.
    assert (fit.constants.dispatch_s, fit.constants.score_boxed_s_per_sample) == (
        start.dispatch_s, start.score_boxed_s_per_sample)


def test_a_single_controller_run_fits_dispatch_and_counts_its_calls():
    plan = compile_plan(replace(_two_host_plan_config(), controller=ControllerConfig(
        kind=ControllerKind.single)))
    start = plan.topology.hardware.cost
    truth = replace(start, dispatch_s=3e-3, dispatches_per_step=2, detok_s_per_token=3e-6)
    measured = measured_phases(_rows(predicted_phases(plan, truth), dispatches=4))
    fit = fit_constants(plan, measured, start)
    assert fit.constants.dispatches_per_step == 2  # 4 calls a step to 2 workers
    assert fit.constants.dispatch_s == pytest.approx(3e-3, rel=1e-6)
    assert fit.constants.detok_s_per_token == pytest.approx(3e-6, rel=1e-6)
    assert predicted_phases(plan, fit.constants).gather > 0  # completions in, rows out


def test_measured_phases_are_medians_after_the_compile_step():
    rows = [{"rollout_s": 9.0, "step_s": 9.0}] + [
        {"rollout_s": r, "host_score_s": 0.1, "host_gather_s": 0.01, "host_scatter_s": 0.02,
         "host_dispatches": 4, "step_s": r + 1} for r in (1.0, 3.0, 2.0)]
    m = measured_phases(rows)
    assert (m.rollout, m.step, m.train, m.score, m.dispatches) == (2.0, 3.0, 0.0, 0.1, 4)
    assert m.gather == pytest.approx(0.03)


def test_cli_writes_into_the_run_directory_and_the_entry_composes(tmp_path, capsys):
    """The entry goes below the run directory, never into the package's conf/ (read-only when
    installed; a checkout would be dirtied), and the line it prints is the way to use it."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    conf_before = sorted(CONF_DIR.rglob("*"))
    calibrate.main([str(run), "name=test_calibrated"])
    out = capsys.readouterr().out
    entry = run / "calibration" / "hardware" / "test_calibrated.yaml"
    assert entry.is_file() and sorted(CONF_DIR.rglob("*")) == conf_before
    assert "rollout" in out and "step" in out and "fitted:" in out
    searchpath = re.search(r"hardware=test_calibrated '(hydra\.searchpath=\[file://\S+\])'",
                           out)
    assert searchpath, out
    cfg = compose_config(["+experiment=arith_co", "hardware=test_calibrated", searchpath[1]])
    hw, base = cfg.hardware, plan_from_json((FIXTURE / "plan.json").read_text()).topology.hardware
    assert hw.name == "test_calibrated" and hw.cost.source.startswith(f"calibrated from {run}")
    assert replace(hw, name=base.name, cost=base.cost) == base
    assert hw.cost.train_efficiency < base.cost.train_efficiency  # this CPU is slower than assumed
    rows = [json.loads(line) for line in (FIXTURE / "metrics.jsonl").read_text().splitlines()]
    measured = measured_phases(rows)
    plan = compile_plan(cfg, DetectedTopology(hosts=1, devices_per_host=1))
    assert plan.cost.co.step_s == pytest.approx(measured.step, rel=0.2)
    assert plan.cost.co.train_s == pytest.approx(measured.train, rel=0.01)


def test_cli_writes_where_it_is_told(tmp_path, capsys):
    calibrate.main([str(FIXTURE), "name=elsewhere", "--out", str(tmp_path / "mine")])
    assert (tmp_path / "mine" / "hardware" / "elsewhere.yaml").is_file()
    assert not (FIXTURE / "calibration").exists()
    assert f"file://{tmp_path / 'mine'}" in capsys.readouterr().out


def test_cli_rejects_unknown_overrides(tmp_path):
    with pytest.raises(SystemExit):
        calibrate.main([str(FIXTURE), "hardware=x", "--out", str(tmp_path)])


def test_one_fit_for_several_runs_recovers_shared_constants():
    plans = [plan_from_json((FIXTURE / "plan.json").read_text()), _two_host_plan()]
    start = plans[0].topology.hardware.cost
    truth = replace(start, decode_efficiency=start.decode_efficiency / 3,
                    prefill_efficiency=start.prefill_efficiency / 3, train_efficiency=0.1,
                    score_gsm8k_s_per_sample=5e-5, encode_s_per_token=3e-6)
    runs = [(p, measured_phases(_rows(predicted_phases(p, truth)))) for p in plans]
    fitted, _ = fit_runs(runs, start)
    for name in ("decode_efficiency", "train_efficiency", "score_gsm8k_s_per_sample",
                 "encode_s_per_token"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6)


def _plan_of_size(hidden: int, layers: int, vocab: int):
    model = ModelConfig(hidden=hidden, num_layers=layers, num_heads=4, num_kv_heads=2,
                        head_dim=hidden // 4, ffn=3 * hidden, vocab=vocab, dtype=DType.float32,
                        tokenizer=TokenizerKind.char)
    cfg = Config(model=model, workload=NO_CHAT,
                 mesh=MeshConfig(kind=MeshKind.cpu, hosts=1, devices_per_host=1),
                 hardware=HardwareSpec(peak_flops_fp32=3.15e11, hbm_bytes=2**34,
                                       hbm_bytes_per_s=3.1e10, ici_bytes_per_s=2.4e10,
                                       dcn_bytes_per_s=2e9))
    return compile_plan(cfg)


def test_runs_of_two_sizes_separate_per_layer_overheads_from_efficiencies():
    small, large, other = (_plan_of_size(128, 2, 32), _plan_of_size(512, 6, 8192),
                           _plan_of_size(256, 4, 1024))
    start = small.topology.hardware.cost
    truth = replace(start, decode_efficiency=start.decode_efficiency / 4,
                    prefill_efficiency=start.prefill_efficiency / 4, train_efficiency=0.3,
                    decode_layer_s=2e-4, train_layer_s=3e-3)
    runs = [(p, measured_phases(_rows(predicted_phases(p, truth)))) for p in (small, large)]
    one_size, notes = fit_runs(runs[:1], start)
    assert one_size.decode_layer_s == 0.0 and one_size.train_layer_s == 0.0
    assert any("two model sizes" in n for n in notes)
    fitted, _ = fit_runs(runs, start)
    for name in ("decode_layer_s", "train_layer_s", "decode_efficiency", "train_efficiency"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-3)
    # A third size, never fitted, is predicted as the truth gives it.
    for phase in ("rollout", "train"):
        assert getattr(predicted_phases(other, fitted), phase) == pytest.approx(
            getattr(predicted_phases(other, truth), phase), rel=1e-3)

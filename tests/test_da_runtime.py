"""DA end to end on a local Ray cluster: overlap with bounded staleness, transfer bytes equal
to the plan, a killed rollout actor restarted without losing or repeating a step, and no Ray
process left behind."""

import json
import tempfile
from pathlib import Path

import pytest

from compiler import compile
from locojax.configure import compose_config
from locojax.disagg.cluster import ENV_TMPDIR, processes_mentioning
from locojax.disagg.faults import KillRollout
from locojax.disagg.transfer import planned_round_bytes

pytestmark = pytest.mark.slow


def _plan(steps: int):
    cfg = compose_config(["+experiment=arith_da", "mesh=cpu", "mesh.hosts=3",
                          "placement.rollout_fraction=0.67", "placement.max_staleness=1",
                          f"run.steps={steps}", "algorithm.sft_warmup_steps=2",
                          "run.eval_every=0", "run.checkpoint_every=2"])
    return compile(cfg, None)


def _run(tmp_path: Path, monkeypatch, steps: int, on_step=None):
    from locojax.disagg.driver import run_da

    ray_tmp = tempfile.mkdtemp(prefix="ljt-", dir="/tmp")  # short: Ray's socket paths
    monkeypatch.setenv(ENV_TMPDIR, ray_tmp)
    plan = _plan(steps)
    code = run_da(plan, tmp_path, on_step=on_step, log=lambda _: None)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return plan, code, rows, ray_tmp


def test_overlapped_run_with_staleness_one_and_planned_transfer(tmp_path, monkeypatch):
    plan, code, rows, ray_tmp = _run(tmp_path, monkeypatch, steps=5)
    assert code == 0
    assert [r["step"] for r in rows] == list(range(5))
    assert max(r["overlap_frac"] for r in rows) > 0
    assert all(r["policy_lag_max"] <= 1 for r in rows)
    assert max(r["policy_lag_max"] for r in rows) == 1  # training really ran one version behind
    assert all(r["dropped_stale"] == 0 for r in rows)
    for r in rows:
        assert r["transfer_bytes"] == plan.transfer.total_bytes
        assert tuple(r["transfer_round_bytes"]) == planned_round_bytes(plan.transfer)
        assert 0 <= r["exposed_transfer_s"] <= r["transfer_s"]
    assert (tmp_path / "hf" / "model.safetensors").exists()
    assert processes_mentioning(ray_tmp) == []
    assert processes_mentioning(str(tmp_path)) == []


def test_killed_rollout_actor_is_restarted_and_no_step_is_lost_or_repeated(tmp_path,
                                                                           monkeypatch):
    _, code, rows, ray_tmp = _run(tmp_path, monkeypatch, steps=5,
                                  on_step=KillRollout(step=2, host=0))
    assert code == 0
    assert [r["step"] for r in rows] == list(range(5))
    assert rows[-1]["rollout_restarts"] == 1
    assert all(r["policy_lag_max"] <= 1 for r in rows)
    assert processes_mentioning(ray_tmp) == []

"""The single controller end to end: a driver process plus one Ray worker per host, the host
costs of every kind in every metrics row, dynamic sampling per host, SIGTERM saving the step
through the workers and the same command resuming there, the same rows and parameters as CO
after the same steps, and no process left behind."""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import warm
from paths import ROOT
from run_output import ROW_KEYS, check_run_output
from safetensors.numpy import load_file
from shared_runs import run_env

from locojax.runtime.process.ray_cluster import processes_mentioning
from locojax.single.driver import WORKER_ENV

pytestmark = pytest.mark.ray

STEPS, PROMPTS, GROUP = 3, 4, 4
RUN = ["+experiment=arith_co", "algorithm.sft_warmup_steps=0", "run.eval_every=0",
       "run.checkpoint_every=0", "mesh=cpu", "mesh.hosts=2", f"run.steps={STEPS}",
       # The smallest run that still trains: 2 prompts x 4 completions per host, 8 tokens,
       # one block; pi_old from the engine, so its log-probs cross the driver both ways.
       f"workload.prompts_per_step={PROMPTS}", f"workload.group_size={GROUP}",
       "workload.max_response_len=8", "workload.eval_prompts=6", "model.num_layers=1",
       "model.hidden=64", "model.ffn=128", "algorithm.old_logprobs=rollout"]
HOST_FIELDS = ("host_dispatch_s", "host_gather_s", "host_scatter_s", "host_detok_s",
               "host_score_s", "host_batch_s")


def _start(run_dir: Path, *overrides: str) -> subprocess.Popen:
    env = run_env()
    return warm.Popen([sys.executable, "-m", "locojax", *RUN, f"hydra.run.dir={run_dir}",
                       *overrides], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _workers(driver: psutil.Process) -> dict[int, int]:
    """Host index -> pid of each live worker below the driver."""
    found = {}
    for p in driver.children(recursive=True):
        try:
            if WORKER_ENV in (env := p.environ()):
                found[int(env[WORKER_ENV])] = p.pid
        except psutil.Error:
            continue
    return found


def _gone(run_dir: Path, workers: dict[int, int]) -> None:
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() !=
                   psutil.STATUS_ZOMBIE for pid in workers.values()), "a worker outlived the run"
    assert not processes_mentioning(str(run_dir)), "Ray left a process behind"


DYN = ("algorithm.dynamic_sampling=filter", "algorithm.max_sample_batches=2")
"""Dynamic sampling on 2 emulated hosts: CO's hosts (each sampling its own extra prompts) and
the single controller's driver (doing it per host for its workers) take the same prompts and
keys, so they log the same rows and end with the same weights."""


@pytest.mark.slow
def test_single_controller_is_a_driver_and_workers_and_ends_with_cos_params(tmp_path):
    """SIGTERM saves through the workers, the same command resumes, and the rows and weights
    are CO's, with dynamic sampling on (one run covers both: each is ~25 s of start-up)."""
    single_dir, co_dir = tmp_path / "single", tmp_path / "co"
    # eval_prompts=1 < 2 hosts: host 1's greedy share is empty (it samples nothing).
    single = ("controller=single", f"run.eval_every={STEPS}", "workload.eval_prompts=1", *DYN)
    proc = _start(single_dir, *single)
    driver, workers, deadline = psutil.Process(proc.pid), {}, time.time() + 600
    metrics = single_dir / "metrics.jsonl"
    while proc.poll() is None and time.time() < deadline:
        workers = _workers(driver) if len(workers) < 2 else workers
        if metrics.exists() and metrics.read_text().strip():
            break
        time.sleep(0.1)
    # SIGTERM during the loop: the step in progress finishes, every worker saves it, one line.
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=900)  # a hang guard, not a speed bound
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    said = re.findall(r"stopped by SIGTERM after step (\d); checkpoint saved: (\S+); resume "
                      "with the same command", stderr)
    assert len(said) == 1 and "Traceback" not in stderr, stderr[-3000:]
    saved = int(said[0][0])
    assert 1 <= saved <= STEPS and Path(said[0][1]) == (single_dir / "checkpoints" /
                                                        str(saved)).absolute()
    assert Path(said[0][1]).is_dir()
    # One worker process per host, each its own process beside the driver, which is none of
    # the jax.distributed group (the workers are: process ids 0 and 1).
    assert sorted(workers) == [0, 1] and proc.pid not in workers.values()
    _gone(single_dir, workers)

    proc = _start(single_dir, *single)  # the same command resumes from the saved step
    out, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    assert f"resumed from the checkpoint of step {saved}" in out + stderr
    # CO's progress line (with ETA) and summary table, whole in a piped log.
    if saved < STEPS:
        check_run_output(stderr, single_dir, STEPS, start=saved)
    assert out.splitlines()[0].startswith(f"weights: the run's checkpoint of step {saved}")
    assert not processes_mentioning(str(single_dir)), "Ray left a process behind"

    rows = _rows(single_dir)
    assert [r["step"] for r in rows] == list(range(STEPS)) and "eval_greedy_accuracy" in rows[-1]
    for r in rows:
        assert ROW_KEYS <= set(r), sorted(ROW_KEYS - set(r))  # CO's row, written the same way
        assert all(r[k] > 0 for k in HOST_FIELDS), {k: r[k] for k in HOST_FIELDS}
        # Two calls a sampled batch and one a train to each of 2 workers; the driver scores
        # every sample of every batch.
        assert r["host_dispatches"] == 2 * (r["sample_batches"] + 1), r
        assert r["host_samples"] == r["groups_sampled"] * GROUP
        assert r["host_gather_bytes"] > 0 and r["host_scatter_bytes"] > r["host_gather_bytes"]
        parts = sum(r.get(k, 0.0) for k in ("rollout_s", "reward_s", "advantage_s", "train_s",
                                            "transfer_s", "eval_s", "host_other_s"))
        assert parts == pytest.approx(r["step_s"], rel=1e-6)
    assert rows[-1]["eval_s"] > 0  # evaluation is its own field, not host work

    co = _start(co_dir, *single[1:])  # the same experiment in CO
    _, stderr = co.communicate(timeout=900)
    assert co.returncode == 0, stderr[-3000:]
    keys = ("reward_mean", "frac_zero_std", "groups_sampled", "groups_padded", "sample_batches")
    co_rows = _rows(co_dir)
    assert [[r[k] for k in keys] for r in co_rows] == [[r[k] for k in keys] for r in rows]
    # one row writer for both modes: the same keys, row by row (evaluation rows included)
    assert [sorted(r) for r in co_rows] == [sorted(r) for r in rows]
    _check_dynamic_sampling(co_rows)
    a, b = (load_file(d / "hf" / "model.safetensors") for d in (single_dir, co_dir))
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-7, err_msg=name)


def _check_dynamic_sampling(rows: list[dict]) -> None:
    """Every row has frac_zero_std and the groups sampled; the train batch stays planned."""
    per_host = PROMPTS // 2
    for r in rows:
        # Each host samples 1 or 2 batches of its 2 prompts.
        assert 1 <= r["sample_batches"] <= 2 and r["groups_sampled"] % per_host == 0
        assert PROMPTS <= r["groups_sampled"] <= PROMPTS * r["sample_batches"]
        assert 0 <= r["groups_padded"] <= PROMPTS and 0 <= r["frac_zero_std"] <= 1
        assert (r["extra_rollout_s"] > 0) == (r["sample_batches"] > 1)
        if r["frac_zero_std"] == 1:  # nothing informative: both batches, every group padded
            assert (r["sample_batches"], r["groups_padded"]) == (2, PROMPTS)

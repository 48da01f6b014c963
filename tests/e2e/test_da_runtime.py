"""DA end to end on a local Ray cluster: overlap with bounded staleness, transfer bytes equal
to the plan, a killed rollout actor restarted without losing or repeating a step, a killed
trainer ending the run with one line and resuming from its checkpoint, a SIGTERM to the driver
saving the step in progress and the resume continuing from it, and no Ray process left behind;
a client without the run's token is refused. Ctrl-C, with nothing listening outside loopback and
no world-writable directory left: test_signal_tail's DA run. An address in LOCOJAX_RAY_ADDRESS
that does not answer is one line (issue 28 item 4; it starts no Ray cluster, so it is not in the
`ray` group). A LoRA DA run
sending the adapters only, their bytes the plan's: test_multiturn_runs' DA run."""

import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import warm
from run_output import ROW_KEYS, check_run_output

from compiler import compile_plan
from locojax.config.compose import compose_config
from locojax.disagg.faults import KillActor
from locojax.disagg.transfer import planned_round_bytes
from locojax.runtime.process.ray_cluster import (
    ENV_ADDRESS,
    ENV_TMPDIR,
    ENV_WAIT,
    processes_mentioning,
)
from locojax.runtime.process.stop import Stopped

pytestmark = pytest.mark.slow


THREE_HOSTS = ("mesh.hosts=3", "placement.rollout_fraction=0.67")
"""Two rollout hosts and a trainer."""
TWO_HOSTS = ("mesh.hosts=2", "placement.rollout_fraction=0.5")
"""A rollout host and a trainer: the runs whose actor that matters is the trainer."""


def _plan(steps: int, *overrides: str, hosts: tuple[str, ...] = THREE_HOSTS):
    cfg = compose_config(["+experiment=arith_da", "mesh=cpu", *hosts, "placement.max_staleness=1",
                          f"run.steps={steps}", "algorithm.sft_warmup_steps=2",
                          "run.eval_every=0", "run.checkpoint_every=2", *overrides])
    return compile_plan(cfg, None)


def _run(tmp_path: Path, monkeypatch, steps: int, on_step=None, log=lambda _: None,
         overrides: tuple[str, ...] = (), hosts: tuple[str, ...] = THREE_HOSTS):
    from locojax.disagg.driver import run_da

    ray_tmp = tempfile.mkdtemp(prefix="ljt-", dir="/tmp")  # short: Ray's socket paths
    monkeypatch.setenv(ENV_TMPDIR, ray_tmp)
    plan = _plan(steps, *overrides, hosts=hosts)
    code = run_da(plan, tmp_path, on_step=on_step, log=log)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return plan, code, rows, ray_tmp


@pytest.mark.ray
def test_overlapped_run_with_staleness_one_planned_transfer_and_a_killed_rollout_actor(
        tmp_path, monkeypatch, capsys):
    """One 5-step run: a stranger refused at step 1, rollout actor 0 killed at step 2 and
    restarted without losing or repeating a step; overlap, staleness and transfers as
    planned throughout."""
    refused: list[bool] = []
    nices: list[int] = []
    kill = KillActor("rollout", step=2, host=0)

    def stranger_at_step_1_kill_at_step_2(step: int, *pids) -> None:
        if step == 1:  # a Ray client on this machine without the run's token
            import ray
            refused.append(_stranger_refused(ray.get_runtime_context().gcs_address))
            nices.extend(psutil.Process(p).nice() for group in pids for p in group.values())
        kill(step, *pids)

    plan, code, rows, ray_tmp = _run(tmp_path, monkeypatch, steps=5,
                                     on_step=stranger_at_step_1_kill_at_step_2)
    assert code == 0 and refused == [True]
    # The actors run at the driver's priority (Ray's default puts workers at nice 15).
    assert nices and set(nices) == {os.nice(0)}, nices
    assert rows[-1]["rollout_restarts"] == 1
    # The progress line (with ETA) and the summary table of every mode, nothing cut.
    err = capsys.readouterr().err
    check_run_output(err, tmp_path, steps=5)
    assert "LoCoJAX run (DA)" in err
    assert [r["step"] for r in rows] == list(range(5))
    # CO's row (the one row builder of every mode) and DA's own fields.
    assert all(ROW_KEYS | {"overlap_frac", "policy_lag_max", "exposed_transfer_s"} <= set(r)
               for r in rows), sorted(ROW_KEYS - set(rows[0]))
    assert max(r["overlap_frac"] for r in rows) > 0
    assert all(r["policy_lag_max"] <= 1 for r in rows)
    assert max(r["policy_lag_max"] for r in rows) == 1  # training really ran one version behind
    assert all(r["dropped_stale"] == 0 for r in rows)
    # Every mode's rows carry the zero-std share (dynamic_sampling=off: one batch per step).
    assert all(0 <= r["frac_zero_std"] <= 1 and r["sample_batches"] == 1 for r in rows)
    # Lagged samples are weighted against the policy that sampled them (decoupled PPO): the
    # trainer's pi_old and the sampler's log-probs differ, and the weight is on.
    assert plan.algorithm.rollout_logp and all(0 < r["rc_weight_mean"] for r in rows)
    assert max(r["logp_mismatch_max"] for r in rows) > 1e-3
    # Until the kill every receiver takes the planned bytes in the planned rounds; the step
    # whose rollout actor was restarted sends to the others (the new actor starts from the
    # current weights), so from there on a row's bytes are whole receivers' shares.
    receivers = len(plan.partitions.rollout_hosts)
    for r in rows:
        if r["step"] < kill.step:
            assert r["transfer_bytes"] == plan.transfer.total_bytes
            assert tuple(r["transfer_round_bytes"]) == planned_round_bytes(plan.transfer)
        assert r["transfer_bytes"] in [plan.transfer.total_bytes * k // receivers
                                       for k in range(1, receivers + 1)], r["transfer_bytes"]
        assert 0 <= r["exposed_transfer_s"] <= r["transfer_s"]
    assert (tmp_path / "hf" / "model.safetensors").exists()
    assert processes_mentioning(ray_tmp) == []
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.ray
def test_killed_trainer_ends_the_run_in_one_line_and_a_rerun_resumes(tmp_path, monkeypatch,
                                                                     capsys):
    # Three runs of 2 actors; step 3 the last: the trainer dies in it, the last rerun runs it.
    plan = _plan(4, hosts=TWO_HOSTS)
    trainer = plan.partitions.trainer_hosts[0]
    _, code, rows, ray_tmp = _run(tmp_path, monkeypatch, steps=4, hosts=TWO_HOSTS,
                                  on_step=KillActor("trainer", step=3, host=trainer))
    assert code == 1
    # The progress lines (`step i/n (p%) ...`, every mode's) are not the error's.
    err = [line for line in capsys.readouterr().err.splitlines()
           if line.strip() and not re.match(r"step \d+/\d+ \(", line)]
    assert len(err) == 1, err
    assert f"trainer actor of host {trainer} died during step 3" in err[0]
    assert "resume from the checkpoint of step 2" in err[0] and "Traceback" not in err[0]
    assert [r["step"] for r in rows] == [0, 1, 2]  # every step the trainer finished
    assert processes_mentioning(ray_tmp) == []
    # The same command again resumes from step 2; a SIGTERM to the driver during step 2 (the
    # first it runs) lets the step finish: the trainer actors save it, its row is written,
    # then `Stopped` (the door's line, exit 143), Ray shut down.
    def sigterm_in_step_2(step: int, *_) -> None:
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Stopped) as stop:
        _run(tmp_path, monkeypatch, steps=4, hosts=TWO_HOSTS, on_step=sigterm_in_step_2)
    said = re.fullmatch(r"stopped by SIGTERM after step 3; checkpoint saved: (\S+); resume "
                        r"with the same command", str(stop.value))
    assert said and stop.value.exit_code == 143, str(stop.value)
    assert Path(said[1]).resolve() == (tmp_path / "checkpoints" / "3").resolve()
    assert Path(said[1]).is_dir() and not (tmp_path / "hf").exists()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "Traceback" not in capsys.readouterr().err
    assert processes_mentioning(os.environ[ENV_TMPDIR]) == []
    # The same command again resumes from the step the stop saved and finishes every step once.
    said: list[str] = []
    _, code, rows, ray_tmp = _run(tmp_path, monkeypatch, steps=4, hosts=TWO_HOSTS,
                                  log=said.append)
    assert code == 0 and "resumed from the checkpoint of step 3" in said, said
    assert [r["step"] for r in rows] == list(range(4))
    assert processes_mentioning(ray_tmp) == []


def _stranger_refused(gcs: str) -> bool:
    """A Ray client on this machine without the run's token cannot join the cluster: the GCS
    answers that its token is missing. The client gives up after 2 tries, not Ray's 20 (one a
    second, each refused the same way: the run's driver waited on them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LD_PRELOAD"))}
    env["RAY_gcs_server_port_wait_time_s"] = "2"  # Ray's connect tries (node._init_gcs_client)
    code = f"import ray; ray.init(address={gcs!r}, log_to_driver=False); print('JOINED')"
    out = warm.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                   timeout=180)
    return (out.returncode != 0 and "JOINED" not in out.stdout
            and "Authentication token is missing or incorrect" in out.stderr)


def test_a_ray_address_that_does_not_answer_is_one_line(tmp_path):
    env = os.environ | {ENV_ADDRESS: "127.0.0.1:1", ENV_WAIT: "2"}
    cmd = [sys.executable, "-m", "locojax", "+experiment=arith_da", "mesh=cpu", "mesh.hosts=3",
           "placement.rollout_fraction=0.67", "run.steps=2", f"hydra.run.dir={tmp_path}"]
    t0 = time.time()
    out = warm.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(f"error: {ENV_ADDRESS}=127.0.0.1:1: no Ray cluster answers "
                               "there within 2 s"), lines
    assert time.time() - t0 < 2 + 150  # start-up, then the stated wait

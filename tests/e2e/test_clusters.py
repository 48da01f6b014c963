"""Real clusters, emulated on one machine: the same `python -m locojax ...` started by hand on
every "host" with a Slurm job's variables (127.0.0.1, one CPU device each) forms one run.

JAX's own Slurm detection reads SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID
and SLURM_LOCALID; the coordinator's port comes from the job id (id % 4096 + 61440), so each
test draws a job id whose port is free.
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import warm
from shared_runs import CHILD_XLA_FLAGS, copied, shared

CMD = [sys.executable, "-m", "locojax", "+experiment=arith_co", "run.steps=3"]
JOB_VARS = ("SLURM_", "OMPI_", "PMI_", "JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
            "TPU_WORKER", "JOB_COMPLETION_INDEX", "XLA_FLAGS")


def _job_id() -> int:
    """A Slurm job id whose coordinator port (JAX's rule) is free on 127.0.0.1 now."""
    while True:
        job = random.randrange(10_000, 10_000_000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", job % 4096 + 61440))
                return job
            except OSError:
                continue


def _env(job: int, host: int, hosts: int = 2) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(JOB_VARS)}
    env.update(SLURM_JOB_ID=str(job), SLURM_STEP_NODELIST="localhost", SLURM_NTASKS=str(hosts),
               SLURM_PROCID=str(host), SLURM_LOCALID=str(host), JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count=1 {CHILD_XLA_FLAGS}")
    return env


def _start(job: int, host: int, args: list[str], cwd: Path) -> subprocess.Popen:
    return warm.Popen(args, cwd=cwd, env=_env(job, host), text=True,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(procs: list[subprocess.Popen], timeout: int = 900) -> list[tuple[int, str, str]]:
    """(returncode, stdout, stderr) of each; the timeout is a hang guard, not a speed bound."""
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append((p.returncode, stdout, stderr))
    return out


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_host_run(tmp_path_factory) -> tuple[Path, list[tuple[int, str, str]]]:
    """The acceptance run, trained once per session (`shared`: whichever xdist worker asks
    first) for the test that reads it and the one that resumes a copy of it: two Slurm hosts
    started by hand, `python -m locojax +experiment=arith_co run.steps=3 hydra.run.dir=<it>`.
    (run dir, (returncode, stdout, stderr) of each host)"""
    def make(run: Path) -> tuple[bool, str]:
        job, args = _job_id(), [*CMD, f"hydra.run.dir={run}"]
        results = _finish([_start(job, h, args, run.parent) for h in (0, 1)])
        (run.parent / "two_hosts.json").write_text(json.dumps(results))
        return True, ""  # the tests check each host's exit

    run = shared(tmp_path_factory, "two_hosts", make)
    results = json.loads((run.parent / "two_hosts.json").read_text())
    return run, [tuple(r) for r in results]


@pytest.mark.slow
def test_two_slurm_hosts_started_by_hand_form_one_run(two_host_run):
    run, results = two_host_run
    for code, _, stderr in results:
        assert code == 0, stderr[-3000:]
    plan = json.loads((run / "plan.json").read_text())
    assert plan["topology"]["hosts"] == 2 and plan["topology"]["devices_per_host"] == 1
    assert [r["step"] for r in _rows(run)] == [0, 1, 2], "one writer, three steps"
    assert "eval_greedy_accuracy" in _rows(run)[-1]
    assert "distributed: 2 hosts joined (slurm, coordinator localhost:" in results[0][1]
    assert "1 cpu device per host" in results[0][1]
    assert "distributed:" not in results[1][1], "only host 0 says how the run was formed"
    assert (run / "checkpoints" / "3").is_dir() and (run / "hf" / "model.safetensors").exists()
    # checkpoint_every=50: the last step is saved off the interval, and only it
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["3"]
    assert sorted(p.name for p in run.glob(".hydra*")) == [".hydra", ".hydra-host1"]


@pytest.mark.slow
def test_an_override_given_to_one_host_stops_both_naming_the_key(tmp_path):
    # Without hydra.run.dir: both hosts land in the job's one default directory.
    job = _job_id()
    run = tmp_path / "outputs" / f"slurm-{job}"
    results = _finish([_start(job, 0, CMD, tmp_path),
                       _start(job, 1, [*CMD, "run.seed=7"], tmp_path)])
    for code, _, stderr in results:
        assert code == 2, stderr[-3000:]
        assert _errors(stderr) == [
            "error: the hosts were started with different configurations: run.seed is 0 on "
            "host 0, 7 on host 1; pass the same overrides to every host"], stderr[-3000:]
        assert "Traceback" not in stderr
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == [f"slurm-{job}"]
    assert sorted(p.name for p in run.glob(".hydra*")) == [".hydra", ".hydra-host1"]
    assert not (run / "plan.json").exists()


@pytest.mark.slow
def test_a_host_that_never_starts_fails_the_other_within_the_init_timeout(tmp_path):
    args = [*CMD, "controller.init_timeout_s=2"]
    began = time.monotonic()
    coordinator = _start(_job_id(), 0, [*args, f"hydra.run.dir={tmp_path / 'a'}"], tmp_path)
    worker = _start(_job_id(), 1, [*args, f"hydra.run.dir={tmp_path / 'b'}"], tmp_path)
    (code0, _, err0), (code1, _, err1) = _finish([coordinator, worker], timeout=300)
    assert (code0, code1) == (2, 2), err0[-3000:] + err1[-3000:]  # not XLA's abort (134)
    assert err0.splitlines() == [
        "error: 1 of 2 hosts joined within controller.init_timeout_s=2 (missing: host 1); "
        "start the same command on every host (one task per host), or give them longer to "
        "start with controller.init_timeout_s"], err0[-3000:]
    (line1,) = err1.splitlines()
    assert line1.startswith(
        "error: at most 1 of 2 hosts joined: host 0, the coordinator at localhost:"), err1[-3000:]
    print(f"both alone hosts stopped {time.monotonic() - began:.1f} s after they started "
          "(init timeout 2 s, Python and JAX start-up included)")


@pytest.mark.slow
def test_hosts_in_different_directories_refuse_to_start(tmp_path):
    job = _job_id()
    results = _finish([_start(job, h, [*CMD, f"hydra.run.dir={tmp_path / name}"], tmp_path)
                       for h, name in ((0, "a"), (1, "b"))])
    for (code, _, stderr), name in zip(results, "ab", strict=True):
        assert code == 2, stderr[-3000:]
        assert _errors(stderr) == [
            f"error: hydra.run.dir={tmp_path / name}: host 1 cannot see host 0's files there, "
            "so the hosts are not writing one run; pass hydra.run.dir=<a path on a filesystem "
            "every host shares> (the same on every host)"], stderr[-3000:]


@pytest.mark.slow
def test_a_host_that_dies_stops_the_other_and_both_resume(two_host_run, tmp_path):
    """Continues a copy of the acceptance run (its programs are in the compilation cache by
    now)."""
    run, results = two_host_run
    assert all(code == 0 for code, _, _ in results), "the run to resume failed"
    run = copied(run, tmp_path)
    job, cwd = _job_id(), run.parent
    # Intervals may change on resume: no evaluation here (the acceptance run evaluated).
    args = [*CMD[:-1], f"hydra.run.dir={run}", "run.checkpoint_every=1", "run.eval_every=0",
            "controller.heartbeat_timeout_s=5"]
    procs = [_start(job, h, [*args, "run.steps=50"], cwd) for h in (0, 1)]
    deadline = time.monotonic() + 900
    while not (run / "checkpoints" / "4").is_dir():
        assert all(p.poll() is None for p in procs), _finish(procs)
        assert time.monotonic() < deadline, "no checkpoint within the hang guard"
        time.sleep(0.2)
    procs[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    (code, _, stderr), _ = _finish(procs, timeout=120)
    stopped = time.monotonic() - killed
    assert code == 1, stderr[-3000:]  # the run broke (not a user error, not XLA's abort)
    assert _errors(stderr) == [
        "error: host 1 stopped sending heartbeats for controller.heartbeat_timeout_s=5 (died, "
        "was killed or hangs): stopping host 0 too"], stderr[-3000:]
    assert "Traceback" not in stderr and "Check failure stack trace" not in stderr
    assert len(_rows(run)) < 50
    print(f"host 0 stopped {stopped:.1f} s after host 1 was killed (heartbeat timeout 5 s)")

    results = _finish([_start(job, h, [*args, "run.steps=6"], cwd) for h in (0, 1)])
    for code, _, stderr in results:
        assert code == 0, stderr[-3000:]
    assert "resumed from the checkpoint of step" in results[0][1]
    assert [r["step"] for r in _rows(run)] == [0, 1, 2, 3, 4, 5]
    assert sorted(p.name for p in run.glob(".hydra*")) == [".hydra", ".hydra-host1"]

    # The run directory's resume check runs on every host: a changed key stops both.
    results = _finish([_start(job, h, [*args, "run.steps=7", "run.seed=5"], cwd)
                       for h in (0, 1)])
    for code, _, stderr in results:
        assert code == 2, stderr[-3000:]
        (line,) = _errors(stderr)
        assert line.startswith(f"error: {run} was made with another configuration: run.seed=0 "
                               "there, 5 now."), stderr[-3000:]
    assert [r["step"] for r in _rows(run)] == [0, 1, 2, 3, 4, 5]


@pytest.mark.slow
def test_evaluation_pads_prompts_that_do_not_divide_over_the_hosts_devices(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(JOB_VARS)}
    env["XLA_FLAGS"] = CHILD_XLA_FLAGS
    args = [*CMD[:-1], "mesh=cpu", "mesh.hosts=2", "mesh.devices_per_host=2", "run.steps=1",
            "algorithm.sft_warmup_steps=0", "run.eval_every=1", "workload.eval_prompts=5",
            "run.checkpoint_every=0", f"hydra.run.dir={tmp_path}"]
    out = warm.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                   timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ValueError" not in out.stderr
    assert json.loads((tmp_path / "plan.json").read_text())["topology"]["hosts"] == 2
    (row,) = _rows(tmp_path)
    # 5 prompts over 2 hosts (3, 2) on 2 devices each: host 0 decodes one padded row
    assert row["eval_greedy_accuracy"] * 5 == pytest.approx(round(row["eval_greedy_accuracy"] * 5))


@pytest.mark.slow
def test_config_keys_join_hosts_that_agree_despite_their_host_index(tmp_path):
    port = _job_id() % 4096 + 61440
    env = {k: v for k, v in os.environ.items() if not k.startswith(JOB_VARS)}
    env.update(JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count=1 {CHILD_XLA_FLAGS}")
    procs = [warm.Popen(
        [*CMD, "run.plan_only=true", f"controller.coordinator=127.0.0.1:{port}",
         "controller.num_hosts=2", f"controller.host_index={h}"],
        cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for h in (0, 1)]
    (code0, out0, err0), (code1, out1, err1) = _finish(procs, timeout=300)
    assert code0 == 0 and code1 == 0, err0[-2000:] + err1[-2000:]
    assert f"distributed: 2 hosts joined (config, coordinator 127.0.0.1:{port})" in out0
    assert "Hosts and roles" in out0 and "Hosts and roles" not in out1  # host 0 prints it
    assert "distributed:" not in out1
    run = tmp_path / "outputs" / f"job-127.0.0.1_{port}"
    assert sorted(p.name for p in run.glob(".hydra*")) == [".hydra", ".hydra-host1"]

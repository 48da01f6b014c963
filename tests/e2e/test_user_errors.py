"""Every entry point's door: a user error is one line on stderr and exit 2, through `locojax`,
`locojax.plan`, `locojax.calibrate`, the local launcher's hosts and the DA driver; a run
directory is checked before any work; a resume that changes the configuration is refused with
plan.json intact; a damaged newest checkpoint falls back to the one before; SIGTERM saves the
step in progress and the resume from it is bit-identical."""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import warm
from paths import ROOT
from shared_runs import QUICK as SHARED_QUICK
from shared_runs import copied, run_env

QUICK = list(SHARED_QUICK)


def _run(*argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return warm.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                    timeout=timeout, cwd=ROOT, env=run_env())


def _one_line(out: subprocess.CompletedProcess, *names: str) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, (out.returncode, out.stderr[-3000:])
    assert "Traceback" not in out.stdout + out.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def finished(finished_co_run: Path) -> Path:
    """The session's 4-step run, checkpoints at steps 2 and 4 (FINISHED: tests/e2e/conftest.py);
    read it, or `_copy` it to change it."""
    return finished_co_run


_copy = copied


@pytest.mark.parametrize("argv,names", [
    (["locojax.plan", "+experiment=arith_co", "+foo=1"], ["error: foo: no such key"]),
    (["locojax.plan", "+experiment=arith_co", "algorithm.loss_aggregation=bogus"],
     ["algorithm.loss_aggregation=bogus", "sequence_mean, token_mean, constant"]),
    (["locojax.plan", "+experiment=arith_co", "model.hidden=0"], ["model.hidden=0: must be"]),
    (["locojax.calibrate", "/nonexistent/run"], ["/nonexistent/run/plan.json"]),
])
def test_config_and_cli_errors_are_one_line(argv, names):
    _one_line(_run(*argv), *names)


def test_run_dir_that_is_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    _one_line(_run("locojax", *QUICK, f"hydra.run.dir={tmp_path / 'afile'}"),
              f"hydra.run.dir={tmp_path / 'afile'}: cannot create the run directory")


def test_user_error_inside_the_run_through_every_runner(tmp_path):
    for name, extra in (("single", []), ("hosts", ["mesh=cpu", "mesh.hosts=2"])):
        out = _run("locojax", *QUICK, "model.checkpoint=/nonexistent", *extra,
                   f"hydra.run.dir={tmp_path / name}")
        _one_line(out, "error: model.checkpoint=/nonexistent: no config.json")


@pytest.mark.slow
@pytest.mark.ray
def test_user_error_through_the_da_driver(tmp_path):
    out = _run("locojax", "+experiment=arith_da", "mesh=cpu", "mesh.hosts=3", "run.steps=2",
               "run.eval_every=0", "algorithm.sft_warmup_steps=2",
               "model.checkpoint=/nonexistent", f"hydra.run.dir={tmp_path}")
    _one_line(out, "model.checkpoint=/nonexistent")


@pytest.mark.parametrize("overrides,names", [
    (["model.hidden=64"], ["model.hidden=128 there, 64 now", "use a new hydra.run.dir"]),
    (["run.seed=7", "algorithm.learning_rate=0.01"],
     ["algorithm.learning_rate=0.0005 there, 0.01 now", "run.seed=0 there, 7 now"]),
    (["run.steps=3"], ["run.steps=3:", "already holds the checkpoint of step 4"]),
])
def test_mismatched_resume_is_refused_with_plan_json_intact(finished, tmp_path, overrides,
                                                            names):
    run_dir = _copy(finished, tmp_path)
    before = _sha(run_dir / "plan.json")
    out = _run("locojax", *QUICK, "run.steps=4", "run.checkpoint_every=2", *overrides,
               f"hydra.run.dir={run_dir}")
    _one_line(out, *names)
    assert _sha(run_dir / "plan.json") == before
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["2", "4"]


def test_resume_may_extend_the_run(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    out = _run("locojax", *QUICK, "run.steps=5", "run.checkpoint_every=2",
               f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from the checkpoint of step 4" in out.stdout + out.stderr
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 5


def test_damaged_newest_checkpoint_falls_back_and_the_run_finishes(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    shutil.rmtree(run_dir / "hf")
    data = max((p for p in (run_dir / "checkpoints" / "4" / "params").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)
    os.truncate(data, data.stat().st_size // 3)
    out = _run("locojax", *QUICK, "run.steps=4", "run.checkpoint_every=2",
               f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert "checkpoint of step 4" in text and "does not restore" in text
    assert "resumed from the checkpoint of step 2" in text and "Traceback" not in text
    assert (run_dir / "hf" / "model.safetensors").exists()
    assert (run_dir / "checkpoints.unrestorable" / "4").is_dir()
    # Steps 2 and 3 ran again from step 2's state: the result equals the straight run's.
    assert _sha(run_dir / "hf" / "model.safetensors") == \
        _sha(finished / "hf" / "model.safetensors")


def test_checkpoint_every_zero_saves_at_the_end_with_stdout_closed_after_a_line(tmp_path):
    """Read as `python -m locojax ... | head -1`: the reader goes after the first line; the
    run goes on to its end (exit 0, no traceback) and saves its last step only."""
    run = warm.Popen([sys.executable, "-m", "locojax", *QUICK, "run.steps=2",
                      "run.checkpoint_every=0", f"hydra.run.dir={tmp_path}"], cwd=ROOT,
                     env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True)
    assert run.stdout.readline()
    run.stdout.close()
    err = run.stderr.read()
    assert run.wait(timeout=600) == 0, err[-3000:]
    assert "Traceback" not in err and "Broken pipe" not in err, err[-3000:]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["2"]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "hf" / "config.json").is_file()


def test_a_signal_saves_the_step_in_progress_and_the_resume_is_bit_identical(finished, tmp_path):
    """SIGTERM during start-up saves nothing; SIGHUP during the steps (the terminal closed:
    answered as SIGTERM, `runtime.process.stop.SIGNALS`) saves the step, exit 129."""
    run_dir = tmp_path / "run"
    # checkpoint_every=3 (the intervals may change on resume): the stop's save is its own.
    argv = [sys.executable, "-m", "locojax", *QUICK, "run.steps=4", "run.checkpoint_every=3",
            f"hydra.run.dir={run_dir}"]
    # Before the first RL step (here: once plan.json is written, during start-up or the
    # warm-up) nothing is saved: one line, 143, every file whole; the run then starts afresh.
    run = warm.Popen(argv, cwd=ROOT, env=run_env(), stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (run_dir / "plan.json").exists():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.02)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and re.fullmatch(
        r"stopped by SIGTERM during (start-up|the supervised warm-up \(after step \d of 2\)); "
        r".*the same command (starts|runs it) again.*", lines[0]), err[-3000:]
    assert json.loads((run_dir / "plan.json").read_text())["run"]["steps"] == 4
    assert json.loads((run_dir / "resolved_config.json").read_text())
    left = [p.name for p in run_dir.rglob("*") if re.search(r"\.partial(-\d+)?$|\.tmp$", p.name)]
    assert left == [] and not list((run_dir / "checkpoints").glob("*"))

    run = warm.Popen(argv, cwd=ROOT, env=run_env(), stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().strip()):  # the first step is done
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.02)
    run.send_signal(signal.SIGHUP)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGHUP, err[-3000:]
    assert "Traceback" not in out + err
    stops = [line for line in err.splitlines() if line.startswith("stopped by")]
    assert len(stops) == 1, err[-3000:]
    said = re.fullmatch(r"stopped by SIGHUP after step (\d); checkpoint saved: (\S+); resume "
                        r"with the same command", stops[0])
    assert said, stops[0]
    step = int(said[1])
    assert 1 <= step < 4 and Path(said[2]) == (run_dir / "checkpoints" / str(step)).absolute()
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir())[-1] == step
    assert len(metrics.read_text().splitlines()) == step and not (run_dir / "hf").exists()

    again = warm.run(argv, cwd=ROOT, env=run_env(), capture_output=True, text=True,
                     timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from the checkpoint of step {step}" in again.stdout + again.stderr
    assert len(metrics.read_text().splitlines()) == 4
    assert _sha(run_dir / "hf" / "model.safetensors") == \
        _sha(finished / "hf" / "model.safetensors")


# ---- issue 28: the run directory owned and checked, the record trusted only when valid ------

def _holding_lock(run_dir: Path) -> subprocess.Popen:
    """Another process holding the run directory's lock (as a running run does)."""
    code = ("import sys; from locojax.runtime.rundir.owner import RunDirLock; "
            f"RunDirLock({str(run_dir)!r}).acquire(); print('held', flush=True); "
            "sys.stdin.read()")
    holder = warm.Popen([sys.executable, "-c", code], cwd=ROOT, env=run_env(), text=True,
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout.readline() == "held\n"
    return holder


def _foreign(d: Path) -> None:
    d.mkdir()
    (d / "passwd").write_text("root:x:0:0\n")
    (d / "hosts").write_text("127.0.0.1 localhost\n")


@pytest.mark.parametrize("damage,names,steps", [
    (lambda d: (d / "metrics.jsonl").unlink() or (d / "metrics.jsonl").mkdir(),
     ["metrics.jsonl: a directory, where the run keeps a file"], 4),
    (lambda d: shutil.rmtree(d / "checkpoints") or (d / "checkpoints").symlink_to(
        d / "checkpoints"), ["checkpoints: a symbolic link that loops"], 4),
    (lambda d: (d / "plan.json").unlink() or (d / "plan.json").mkdir(),
     ["plan.json: a directory"], 4),
    # read when the run resumes to train on (a run finished at its steps reads nothing)
    (lambda d: (d / "provenance.json").write_text("{not json"),
     ["provenance.json: damaged", "remove it to resume"], 5),
])
def test_a_damaged_run_directory_is_one_line_before_any_work(finished, tmp_path, damage, names,
                                                             steps):
    run_dir = _copy(finished, tmp_path)
    damage(run_dir)
    out = _run("locojax", *QUICK, f"run.steps={steps}", "run.checkpoint_every=2",
               f"hydra.run.dir={run_dir}")
    _one_line(out, str(run_dir), *names)
    assert not list(run_dir.glob(".*.partial"))


def test_a_foreign_directory_and_a_held_one_are_refused(tmp_path):
    _foreign(tmp_path / "foreign")
    out = _run("locojax", *QUICK, f"hydra.run.dir={tmp_path / 'foreign'}")
    _one_line(out, f"hydra.run.dir={tmp_path / 'foreign'}: not empty and not a LoCoJAX run "
                   "directory (it holds hosts, passwd)", "run.reuse_dir=true")
    assert sorted(p.name for p in (tmp_path / "foreign").iterdir()
                  if not p.name.startswith((".hydra", "__main__"))) == ["hosts", "passwd"]
    (tmp_path / "held").mkdir()
    holder = _holding_lock(tmp_path / "held")
    try:
        out = _run("locojax", *QUICK, f"hydra.run.dir={tmp_path / 'held'}")
        _one_line(out, f"hydra.run.dir={tmp_path / 'held'}: another run is using it (pid "
                       f"{holder.pid} on host ")
        assert not (tmp_path / "held" / "plan.json").exists()
    finally:
        holder.communicate("", timeout=60)


@pytest.mark.parametrize("text", ["null", "42"])
def test_a_damaged_record_falls_back_to_plan_json(finished, tmp_path, text):
    run_dir = _copy(finished, tmp_path)
    (run_dir / "resolved_config.json").write_text(text)
    before = _sha(run_dir / "plan.json")
    out = _run("locojax", *QUICK, "run.steps=4", "run.checkpoint_every=2", "run.seed=7",
               "algorithm.learning_rate=0.01", f"hydra.run.dir={run_dir}")
    _one_line(out, "run.seed=0 there, 7 now", "algorithm.learning_rate=0.0005 there, 0.01 now")
    assert _sha(run_dir / "plan.json") == before


def test_a_checkpoint_of_another_format_is_refused(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    meta = run_dir / "checkpoints" / "4" / "meta" / "metadata"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "step": 999, "seed": 5,
                                "format": 99}))
    before = _sha(run_dir / "plan.json")
    out = _run("locojax", *QUICK, "run.steps=5", "run.checkpoint_every=2",
               f"hydra.run.dir={run_dir}")
    _one_line(out, f"{run_dir / 'checkpoints' / '4'}: checkpoint format 99, this LoCoJAX reads "
                   "format 1")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["2", "4"]
    assert _sha(run_dir / "plan.json") == before


# ---- issue 62, item 1: damaged files of a run directory on resume ----------------------------

def test_a_resume_over_damaged_rows_and_lease_says_so_and_finishes(finished, tmp_path):
    """The second round's open fault (a last metrics line `{}`: KeyError 'step') and a lease
    that is no lease: one warning line each naming the file, the run goes on to its end."""
    run_dir = _copy(finished, tmp_path)
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write("{}\n")
    (run_dir / ".locojax.lock").write_text('{"pid": -1, "host": 7}')
    out = _run("locojax", *QUICK, "run.steps=5", "run.checkpoint_every=2",
               f"hydra.run.dir={run_dir}")
    assert out.returncode == 0 and "Traceback" not in out.stdout + out.stderr, out.stderr[-3000:]
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, warnings
    assert f"{run_dir / 'metrics.jsonl'}: line 5 is not a metrics row" in warnings[1]
    assert f"{run_dir / '.locojax.lock'}: holds no lease" in warnings[0]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(5))

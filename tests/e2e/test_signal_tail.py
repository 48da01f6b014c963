"""No signal is dropped at the end of a run (issue 28): real runs of the tiny model on the
user's-task example. A SIGTERM during the last step's evaluation saves that step and exits
143 with its line, without the export (the same command then exports); one during that export
lets it finish and says the run is complete (or, when it lands after the export, that the run
had finished). The single controller (its driver evaluates; its Ray worker saves) and DA (its
rollout actors evaluate; its trainer saves) stop the same way during the last evaluation; DA's
is a Ctrl-C (SIGINT), and its run also checks that nothing listens outside loopback and that no
Ray process or world-writable directory is left. The in-process cases, the line after the
export included: tests/runtime/test_stop_tail.py."""

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import warm
from listening import listening_once_stepping, loopback
from paths import ROOT
from shared_runs import run_env

from locojax.runtime.process.ray_cluster import ENV_TMPDIR, processes_mentioning

EXAMPLE = ROOT / "examples" / "reverse"
# Two steps; only the last saves and evaluates (eval_every=2): the first reward call that
# scores fewer completions than a step's (8 x 4, or 16 on each of DA's 2 rollout hosts) is
# the evaluation's (4 prompts, one greedy sample each).
BASE = ["+experiment=arith_co", "workload=custom",
        f"+workload.data_files.train={EXAMPLE / 'train.jsonl'}", "algorithm.sft_warmup_steps=0",
        "run.steps=2", "run.eval_every=2", "run.checkpoint_every=0",
        "workload.prompts_per_step=8", "workload.group_size=4", "workload.eval_prompts=4"]
STOPPER = '''
import os, signal
from pathlib import Path

def stop_in_eval(prompts, completions, **columns):
    """SIGTERM to the run (this worker's parent) on the first call of the last step's
    evaluation (fewer completions than a step's)."""
    run = Path(os.environ["STOP_RUN_DIR"])
    mark, driver = run.parent / "signal-sent", run.parent / "driver.pid"
    if len(completions) <= 4 and not mark.exists():
        mark.write_text("sent")  # DA scores in a rollout actor: the driver's pid from the test
        os.kill(int(driver.read_text()) if driver.exists() else os.getppid(),
                getattr(signal, os.environ.get("STOP_SIGNAL", "SIGTERM")))
    return [0.0] * len(completions)
'''
def _stopped(sig: signal.Signals) -> re.Pattern:
    return re.compile(rf"stopped by {sig.name} after step 2; checkpoint saved: (\S+); resume "
                      r"with the same command")


def _env(**extra: str) -> dict[str, str]:
    return run_env() | extra


def _argv(tmp_path: Path, run_dir: Path) -> list[str]:
    fn = tmp_path / "stopper.py"
    fn.write_text(STOPPER)
    # workload.correct: a verdict, so that the evaluation's row has its eval_greedy_accuracy
    # (issue 40)
    return [sys.executable, "-m", "locojax", *BASE, f"+workload.reward_fns.stop={fn}:stop_in_eval",
            "workload.correct=stop", f"hydra.run.dir={run_dir}"]


def _stops(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("stopped by")]


def _saved_at_step_2_without_export(tmp_path: Path, run_dir: Path, code: int, out: str,
                                    err: str, sig: signal.Signals = signal.SIGTERM) -> None:
    """A run stopped by `sig` during its last evaluation: exit 128 + sig, one line naming step
    2's checkpoint, which exists, no traceback, the evaluation's row written, no export."""
    assert (tmp_path / "signal-sent").exists(), err[-3000:]
    assert code == 128 + sig, err[-3000:]
    assert "Traceback" not in out + err
    stops, stopped = _stops(err), _stopped(sig)
    assert len(stops) == 1 and stopped.fullmatch(stops[0]), err[-3000:]
    assert Path(stopped.fullmatch(stops[0])[1]) == (run_dir / "checkpoints" / "2").absolute()
    assert (run_dir / "checkpoints" / "2").is_dir() and not (run_dir / "hf").exists()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and "eval_greedy_accuracy" in rows[-1]  # the evaluation ran to its end


def test_sigterm_during_the_last_evaluation_saves_then_one_during_the_export_finishes_it(
        tmp_path):
    """The run stopped during its last evaluation; the same command again resumes and exports
    (the stopper stays quiet: its mark is there), and a SIGTERM during that export lets it
    finish and says the run is complete."""
    run_dir = tmp_path / "run"
    argv = _argv(tmp_path, run_dir)
    out = warm.run(argv, cwd=ROOT, env=_env(STOP_RUN_DIR=str(run_dir)),
                   capture_output=True, text=True, timeout=900)
    _saved_at_step_2_without_export(tmp_path, run_dir, out.returncode, out.stdout, out.stderr)

    run = warm.Popen(argv, cwd=ROOT, env=_env(STOP_RUN_DIR=str(run_dir)),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 900
    # the export's first write: into .hf.partial-<pid>, swapped in as hf/ once whole
    while not any(run_dir.glob(".hf.partial-*")) and not (run_dir / "hf").exists():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.01)
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=300)
    assert "Traceback" not in out + err
    assert (run_dir / "hf" / "config.json").is_file() and (run_dir / "checkpoints" / "2").is_dir()
    if run.returncode == 0:
        # The export of this tiny model takes milliseconds: under load the run may finish
        # before the signal is sent (to a process already gone). Then it is a finished run;
        # the signal's handling inside the export is held by tests/runtime/test_stop_tail.py.
        # The rerun ran no step (step 2 was saved): its summary is the one line of a rerun.
        assert not _stops(err) and "already complete at step 2: nothing to run" in err, err
        return
    assert run.returncode == 128 + signal.SIGTERM, err[-3000:]
    stops = _stops(err)
    assert len(stops) == 1 and stops[0] in (
        "stopped by SIGTERM during the final export; the last checkpoint and the HF export "
        "were finished first; the run is complete",
        "stopped by SIGTERM after the run finished; everything is saved"), err[-3000:]


# The single controller evaluates in its driver, whose reward workers are its children: the
# stopper's SIGTERM reaches the driver, and its Ray worker saves the step (the smallest model).
TINY = ["model.num_layers=1", "model.hidden=64", "model.ffn=128", "workload.max_response_len=8"]
SINGLE = ["controller=single", "mesh=cpu", "mesh.hosts=1", *TINY]
DA = ["mesh=cpu", "mesh.hosts=2", "placement.rollout_fraction=0.5", *TINY]


@pytest.mark.slow
@pytest.mark.ray
def test_single_controller_sigterm_during_the_last_evaluation_saves_and_skips_the_export(
        tmp_path):
    run_dir = tmp_path / "run"
    out = warm.run([*_argv(tmp_path, run_dir), *SINGLE], cwd=ROOT,
                   env=_env(STOP_RUN_DIR=str(run_dir)), capture_output=True, text=True,
                   timeout=900)
    _saved_at_step_2_without_export(tmp_path, run_dir, out.returncode, out.stdout, out.stderr)


@pytest.mark.slow
@pytest.mark.ray
def test_da_ctrl_c_during_the_last_evaluation_saves_and_leaves_no_ray_process(tmp_path):
    """DA evaluates in its rollout actors while the driver collects the last step's row: a
    Ctrl-C (SIGINT, from the stopper) makes the driver save step 2 through the trainer, one
    line, exit 130, no export. While the run is up no process of it listens outside loopback
    (as `ss -ltnp` would list them); once it ends no Ray process is left and no directory it
    made is world-writable."""
    run_dir, ray_tmp = tmp_path / "run", tempfile.mkdtemp(prefix="ljc-", dir="/tmp")
    argv = [a.replace("+experiment=arith_co", "+experiment=arith_da")
            for a in _argv(tmp_path, run_dir)]
    # A job started in the background by a non-interactive shell inherits SIGINT ignored,
    # and so would this child: give it the default disposition, as a terminal's job has (a
    # subprocess: the warm server's runs take no `preexec_fn`).
    run = subprocess.Popen([*argv, *DA], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           env=_env(STOP_RUN_DIR=str(run_dir), STOP_SIGNAL="SIGINT",
                                    **{ENV_TMPDIR: ray_tmp}),
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    (tmp_path / "driver.pid").write_text(str(run.pid))  # the same pid after the re-exec
    listening = listening_once_stepping(run, run_dir / "metrics.jsonl")
    assert any(name == "gcs_server" for _, _, name in listening), listening
    assert [x for x in listening if not loopback(x[0])] == []
    out, err = run.communicate(timeout=900)
    _saved_at_step_2_without_export(tmp_path, run_dir, run.returncode, out, err, signal.SIGINT)
    for _ in range(20):  # Ray's workers exit on their own once the driver is gone
        if not processes_mentioning(ray_tmp):
            break
        time.sleep(0.5)
    assert processes_mentioning(ray_tmp) == []
    writable = [str(p) for d in (tmp_path, Path(ray_tmp)) for p in [d, *d.rglob("*")]
                if p.is_dir() and not p.is_symlink() and p.stat().st_mode & 0o002]
    assert writable == []
    shutil.rmtree(ray_tmp, ignore_errors=True)

"""The CO runtime end to end: `python -m locojax` runs, resumes bit-identically, survives no
dead host silently, and runs as two real `jax.distributed` processes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import warm
from hf_reference import HfDir, greedy, same_greedy
from libtpu_maps import assert_none_loaded, recording
from listening import listening_once_stepping, loopback
from paths import FIXTURES, ROOT
from run_output import ROW_KEYS, check_run_output, progress_steps
from shared_runs import FINISHED, copied, output_of, run_env, sockets_of

from locojax.runtime.rundir.files import export_complete

PEERS_PYTHON = Path(os.environ.get("LOCOJAX_PEERS_PYTHON", ROOT / ".venv-peers/bin/python"))
"""The peers' venv (`make peers`; benchmarks/peers_python.py): transformers, when it exists."""

SHORT = ["+experiment=arith_co", "algorithm.sft_warmup_steps=2", "run.eval_every=0"]


def _cmd(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "locojax", *SHORT, f"hydra.run.dir={run_dir}", *overrides]


def _run(run_dir: Path, *overrides: str, timeout: int = 600,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return warm.run(_cmd(run_dir, *overrides), capture_output=True, text=True,
                    timeout=timeout, cwd=ROOT, env=env or run_env())


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_single_host_run_writes_metrics_plot_checkpoint_and_hf_export(tmp_path, finished_co_run):
    """The session's single-host run (FINISHED: 4 steps, checkpoints at steps 2 and 4, an
    evaluation after the last step), its output kept as it printed it; the command again on a
    copy. (That the last step is saved off the interval too: the Slurm acceptance run, whose
    only checkpoint is its last step's, test_clusters.)"""
    run = finished_co_run
    stdout, stderr = output_of(run)
    # Where the weights, dtypes and data come from: the run's first lines.
    said = stdout.splitlines()
    assert said[0] == "weights: random initialisation (run.seed=0): no model.checkpoint", said
    assert said[1].startswith("dtypes: compute float32 (the cpu default") and \
        said[2].startswith("data: arith, generated in code")
    # stderr is a pipe, as in a batch system's log: one whole line per step, nothing cut.
    check_run_output(stderr, run, steps=4)
    # A single run is no sweep: the sweep callbacks neither warn nor write a multirun table.
    assert "Callback" not in stderr and "runs.csv" not in stderr, stderr[-2000:]
    rows = _rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        assert ROW_KEYS <= set(r)
        assert r["host_samples"] == 24 * 16  # one host detokenises and scores every sample
        assert r["host_score_s"] > 0 and r["host_detok_s"] > 0 and r["host_batch_s"] > 0
        assert r["host_dispatches"] == 0 and r["host_gather_bytes"] > 0
        # dynamic_sampling=off: the step's 24 groups, once; frac_zero_std logged anyway.
        assert (r["groups_sampled"], r["sample_batches"], r["groups_padded"]) == (24, 1, 0)
        assert 0 <= r["frac_zero_std"] <= 1 and r["extra_rollout_s"] == 0
    assert "eval_greedy_accuracy" in rows[-1] and rows[-1]["eval_s"] > 0 and "eval_s" not in rows[0]
    # Static shapes: the first step compiles its programs, no later step recompiles.
    assert rows[0]["compiles"] > 0 and [r["compiles"] for r in rows[1:]] == [0, 0, 0]
    for r in rows:
        parts = sum(r.get(k, 0.0) for k in ("rollout_s", "reward_s", "advantage_s", "train_s",
                                            "transfer_s", "eval_s", "host_other_s"))
        assert parts == pytest.approx(r["step_s"], rel=1e-6)
    assert rows[-1]["eval_s"] > 0  # evaluation is its own field, not host work
    assert (run / "rewards.png").stat().st_size > 0
    assert export_complete(run / "hf", 4)  # of the last step, whose save was in flight
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2", "4"]
    assert list((run / "tb").iterdir()), "TensorBoard events written"
    _export_decodes_as_ours(run / "hf")
    # The same command again (on a copy): the run is complete, one line, exit 0, nothing
    # started.
    run = copied(run, tmp_path)
    again = warm.run([sys.executable, "-m", "locojax", *FINISHED, f"hydra.run.dir={run}"],
                     capture_output=True, text=True, timeout=600, cwd=ROOT, env=run_env())
    assert again.returncode == 0, again.stderr[-3000:]
    assert ("already complete at step 4: nothing to run (raise run.steps to train on); "
            f"metrics {run / 'metrics.jsonl'}, final policy {run / 'hf'}") in \
        again.stderr.splitlines()
    assert not progress_steps(again.stderr) and "│" not in again.stderr
    assert "weights:" not in again.stdout and len(_rows(run)) == 4


def test_a_one_host_run_opens_no_network_socket(finished_co_run):
    """A host that cannot open a TCP or UDP socket (issue 59's TPU VM) runs single-host CO:
    no process of the session's run (FINISHED: warm-up, 4 steps, 2 checkpoints, an
    evaluation, the HF export) created, bound, connected or sent from one, or looked up a
    host name (tests/fixtures/socket_audit); its Unix socketpairs are not counted."""
    said = sockets_of(finished_co_run).read_text().splitlines()
    starts = [line for line in said if line.startswith("start ")]
    assert starts and "+experiment=arith_co" in starts[0], said[:3]  # the audit was on
    assert said == starts, [line for line in said if line not in starts]


def _export_decodes_as_ours(export: Path) -> None:
    """The trained export, read with tokenizers + safetensors alone (and with transformers
    when the peers' venv exists), decodes greedily to `locojax-sample model.checkpoint=<it>`'s
    tokens: no other key needed (its tokenizer is the run's)."""
    prompt, n = "3+4=", 8
    sample = warm.run([sys.executable, "-m", "locojax.sample", f"model.checkpoint={export}",
                       f"prompt='{prompt}'", "sampling.temperature=0",
                       f"sampling.max_new_tokens={n}", "output=ids"],
                      capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert sample.returncode == 0, sample.stderr[-2000:]
    ours = [int(t) for t in sample.stdout.split()]
    ref, gaps = greedy(HfDir.read(export), prompt, n)
    assert same_greedy(ours, ref, gaps), (ours, ref, gaps)
    peers = PEERS_PYTHON
    if peers.is_file():  # transformers' AutoTokenizer + AutoModelForCausalLM, export alone
        theirs = warm.run([str(peers), str(FIXTURES / "check_hf_export.py"), "greedy",
                           str(export), prompt, str(n)], capture_output=True, text=True,
                          timeout=600)
        assert theirs.returncode == 0, theirs.stderr[-2000:]
        assert same_greedy(ours, json.loads(theirs.stdout.splitlines()[-1]), gaps)


@pytest.mark.slow
def test_sigkill_then_resume_ends_with_the_same_params(tmp_path, finished_co_run):
    # The uninterrupted run is the session's (FINISHED: these overrides and steps), the
    # killed one the same command.
    steps = ["run.eval_every=4", "run.steps=4", "run.checkpoint_every=2"]
    assert [*SHORT[:-1], *steps] == list(FINISHED)
    straight = finished_co_run
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "locojax", *FINISHED, f"hydra.run.dir={killed}"]
    env = run_env()
    proc = warm.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (killed / "checkpoints" / "2").exists():
        assert proc.poll() is None and time.time() < deadline, "no checkpoint before the kill"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "hf").exists(), "the kill came too late to test a resume"
    resumed = warm.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from the checkpoint of step" in resumed.stdout + resumed.stderr
    assert [r["step"] for r in _rows(killed)] == [0, 1, 2, 3]
    a = (straight / "hf" / "model.safetensors").read_bytes()
    b = (killed / "hf" / "model.safetensors").read_bytes()
    assert a == b, "resumed run's final params differ from the uninterrupted run"


def test_a_smaller_prompt_store_runs_the_same_steps(tmp_path):
    """sampling.prompt_store=4: the plan's store holds 4 of the host's 24 prompts at a time,
    the engine prefills the next 4 inside its slot loop; the run's rows and final policy are
    the whole store's. Both runs take a KL term, which is 0 at step 0 (the step trains the
    reference itself) and grows after."""
    runs = {}
    # The engine's own log-probs enter the loss only through the rollout correction
    # (algorithm.rollout_correction); they differ in the last bits with the prefill's row
    # count, so this check of the store's schedule (same tokens, same update) turns it off.
    for store in (0, 4):
        out = _run(tmp_path / str(store), "run.steps=2", "run.checkpoint_every=0",
                   "run.eval_every=1", f"sampling.prompt_store={store}",
                   "algorithm.rollout_correction=none",
                   "algorithm.kl_coef=0.05", "algorithm.learning_rate=3e-3")
        assert out.returncode == 0, out.stderr[-3000:]
        plan = json.loads((tmp_path / str(store) / "plan.json").read_text())
        runs[store] = plan["batch"]["prompt_store_rows"], _rows(tmp_path / str(store))
    assert (runs[0][0], runs[4][0]) == (24, 4)
    for key in ("reward_mean", "response_len_mean", "loss", "eval_greedy_accuracy", "kl"):
        assert [r.get(key) for r in runs[4][1]] == [r.get(key) for r in runs[0][1]], key
    rows = runs[0][1]
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6), "step 0 trains the reference itself"
    assert rows[1]["kl"] > 0.0
    weights = [(tmp_path / str(s) / "hf" / "model.safetensors").read_bytes() for s in (0, 4)]
    assert weights[0] == weights[1]


@pytest.mark.slow
def test_a_dead_host_stops_the_run_with_a_clear_error(tmp_path):
    """Once stepping, the 2-host emulation listens on loopback only (jax.distributed's
    coordinator, gloo's collectives: issue 41); host 1 killed, the run stops in one line."""
    env = run_env()
    proc = warm.Popen(_cmd(tmp_path, "mesh=cpu", "mesh.hosts=2", "run.steps=200",
                           "controller.heartbeat_timeout_s=5"),
                      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      text=True)
    sockets = listening_once_stepping(proc, tmp_path / "metrics.jsonl")
    assert len(sockets) >= 2, sockets  # the coordinator and gloo's, at least
    assert [x for x in sockets if not loopback(x[0])] == []
    children = psutil.Process(proc.pid).children(recursive=True)
    host1 = [p for p in children if p.environ().get("JAX_PROCESS_ID") == "1"]
    assert host1, "host 1 process not found"
    host1[0].kill()
    _, stderr = proc.communicate(timeout=120)  # a hang guard, not a speed bound
    assert proc.returncode != 0
    assert "host 1 died" in stderr
    assert len(_rows(tmp_path)) < 200, "the run went on without host 1"
    assert not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_lora_on_two_hosts_trains_the_adapters_and_exports_them(tmp_path, tmp_path_factory):
    """Two real `jax.distributed` host processes run one global train step a step (both
    sample, every row has each host's rollout time), here with LoRA adapters; no process of
    the CPU run (the launcher, the hosts, their workers) loads libtpu."""
    # No warm-up: with LoRA the KL reference is the base itself, before any warm-up.
    env, maps = recording(tmp_path_factory.mktemp("maps"), run_env())  # not in the run dir
    out = _run(tmp_path, "mesh=cpu", "mesh.hosts=2", "run.steps=2", "run.checkpoint_every=0",
               "algorithm.sft_warmup_steps=0", "algorithm.lora.rank=8",
               "algorithm.kl_coef=0.05", "algorithm.lora.learning_rate=5e-3", env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert_none_loaded(maps, out.stderr, processes=3)  # the launcher and its 2 hosts, at least
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert 0 < plan["model"]["trainable_count"] < plan["model"]["param_count"] / 5
    assert plan["partitions"]["rollout_hosts"] == [0, 1]
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == [0, 1]
    assert all(len(r["rollout_s_per_host"]) == 2 for r in rows)
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6), "B = 0: step 0's policy is the base"
    assert rows[1]["kl"] > 0.0, "the adapters moved the merged rollout policy"
    assert export_complete(tmp_path / "hf", 2)
    config = json.loads((tmp_path / "hf" / "lora" / "adapter_config.json").read_text())
    assert config["r"] == 8 and "q_proj" in config["target_modules"]
    assert (tmp_path / "hf" / "lora" / "adapter_model.safetensors").stat().st_size > 0
    # locojax-eval on the run directory: its last step's adapters merged onto the run's base
    # sample what the merged export samples, token for token (issue 40)
    common = ["+experiment=arith_co", "eval.samples=2", "eval.prompts=6",
              "sampling.temperature=1.0"]
    for name, checkpoint in (("step", tmp_path), ("hf", tmp_path / "hf")):
        out = warm.run([sys.executable, "-m", "locojax.eval", *common,
                        f"eval.checkpoint={checkpoint}", f"eval.out={tmp_path / name}"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env=run_env())
        assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "step" / "samples.jsonl").read_text() == \
        (tmp_path / "hf" / "samples.jsonl").read_text()

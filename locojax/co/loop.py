"""The RL loop of one host: local rollout and reward, one global train step per step.

    plan.json ──build_host──> Host (meshes, model, tokenizer, problems, scorer)
    Trainer.start: checkpoint? restore  (else HF weights | random init, SFT warm-up, reference)
    for step in [start, run.steps):
        prompts[range of this host] ──rollout (local mesh, one compiled program)──> completions
            ──reward (this host's scorer)──> rewards_PxG ──advantages (per group)──> rows
            (dynamic sampling: more of its own prompts until its groups carry signal)
        Trainer.train(rows): rows of every host ──> global TrainBatch ──> one jitted step on
            the global mesh ──> NaN guard (a non-finite step stops the run, unsaved)
        Trainer.rollout_weights: on-host reshard (the plan's CO transfer), compute dtype
        stats + SIGTERM/SIGINT flag of every host ──all-gather──> metrics.jsonl, TensorBoard,
            progress bar; a flag on any host: every host saves this step and stops (`Stopped`)
        Orbax save every checkpoint_every (after the step's row: a resume never starts after
            a step whose row was lost with a host)
        every eval_every: greedy accuracy (k samples: pass@1, pass@k, maj@k), held out
    end: HF export (run_dir/hf); the primary host: reward/timing plot, summary (co.host)

The loop itself (cadences, rows, the stop, the export) is `runtime.loop`'s, as in every
mode; this module is CO's part of it. The single controller (`locojax.single`) runs the same
phases with the host work moved to its driver.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from compiler.plan import ExecutionPlan
from locojax.episodes.keys import StepKeys
from locojax.runtime.components import Host, build_host
from locojax.runtime.episode import eval_samples, step_episode
from locojax.runtime.evaluation import eval_fields
from locojax.runtime.loop import Begun, StepDone, run_loop
from locojax.runtime.observe.compiles import COMPILES
from locojax.runtime.observe.device_memory import peak_bytes
from locojax.runtime.observe.stats import busiest_host, episode_stats
from locojax.runtime.process.distributed import every_host
from locojax.runtime.process.stop import StopSignals, agreed_signal, set_phase
from locojax.runtime.rundir.files import HF_DIR
from locojax.runtime.steps import RunSummary, eval_problems
from locojax.runtime.trainer import Trainer


def _peaks(rollout: int | None, step: int | None) -> dict[str, int]:
    """The device's peak bytes after the rollout and after the step (accelerators only)."""
    if rollout is None or step is None:
        return {}
    return {"rollout_peak_bytes": rollout, "device_peak_bytes": step}


class HostSteps:
    """CO's part of the loop (`runtime.loop.Mode`) on one host: its own episode, the global
    train step, the on-host reshard and the statistics all-gather that carries the stop
    vote."""

    progress_keys: dict[str, str] = {}

    def __init__(self, host: Host, host_index: int, run_dir: Path):
        self.host, self.index, self.run_dir = host, host_index, run_dir
        self.trainer = Trainer(host, run_dir, host.prompt_range(), primary=host.role.is_primary)
        self.local = None
        """The rollout copy of the weights (it may alias the master weights)."""

    def begin(self, log) -> Begun:
        start = self.trainer.start(log)
        self.local = self.trainer.rollout_weights()
        return Begun(start.step, start.sft_loss)

    def step(self, step: int, stop: StopSignals, emit: Callable[[StepDone], None]
             ) -> int | None:
        host, trainer = self.host, self.trainer
        COMPILES.take()  # the warm-up's and the last evaluation's: not this step's phases
        t0 = time.time()
        episode = step_episode(host, self.local, step, host.prompt_range(), self.index)
        rollout_peak = peak_bytes()
        t1 = time.time()
        self.local = None  # it may alias the master weights, which the step donates
        metrics = trainer.train(step, episode.rows, save=False)
        t2 = time.time()
        self.local = jax.block_until_ready(trainer.rollout_weights())
        t3 = time.time()
        # The stop flag rides in the statistics all-gather: every host decides on the same
        # step. CO's only host-side exchange (no driver round trips, no scatter: rows never
        # leave their host).
        gathered = every_host(np.append(episode_stats(episode), stop.flag))
        stats, signum = gathered[:, :-1], agreed_signal(gathered[:, -1].tolist())
        work = busiest_host(stats)
        work.add("gather", time.time() - t3)
        work.gather_bytes = gathered.nbytes
        times = {"train_s": t2 - t1, "transfer_s": t3 - t2, **work.fields(),
                 "compiles": COMPILES.take(), **_peaks(rollout_peak, peak_bytes())}
        emit(StepDone(step, t0, stats, metrics, times))
        # Saved after its row: a host lost after the save's commit cannot lose the row of
        # the step a resume starts after (its row needs every host's statistics).
        trainer.save_due(step + 1)
        return signum

    def evaluate(self, done: StepDone) -> dict[str, float]:
        """Held-out greedy accuracy (pass@1, pass@k, maj@k for run.eval_samples = k > 1)
        over every host's share (each samples and scores its own)."""
        host = self.host
        problems = eval_problems(host.data.workload, host.plan.workload.eval_prompts,
                                 host.role.index, host.role.count)
        key = StepKeys(host.plan.run.seed, done.step).evaluation()
        k = host.plan.run.eval_samples
        sums = every_host(eval_samples(host, self.local, problems, key, k).sums()).sum(axis=0)
        return eval_fields(sums, k)

    def drain(self) -> list[StepDone]:
        return []

    def vote(self, flag: float) -> int | None:
        return agreed_signal(every_host(np.array([flag])).ravel().tolist())

    def save_now(self, done: int) -> Path:
        self.local = None
        return self.trainer.save_now(done)

    def settle(self) -> None:
        """Before an error ends the run (a reward function's, a NaN): the saves in flight
        finish, so the last checkpoint is whole (and no save is cut by the exit)."""
        with contextlib.suppress(Exception):  # the error that ends the run is the one to say
            self.trainer.checkpoints.wait()

    def finish(self) -> Path | None:
        export = self.trainer.finish(self.run_dir / HF_DIR)
        self.host.close()
        return export


def run_host(plan: ExecutionPlan, run_dir: Path, host_index: int, log=print) -> RunSummary:
    """Run the plan's RL loop as host `host_index`; resumes from the run's last checkpoint.
    SIGTERM / SIGINT during the steps: the step in progress finishes and is saved on every
    host, then `Stopped` (see `runtime.process.stop`)."""
    began = time.time()
    set_phase("start-up")
    host = build_host(plan, host_index)
    steps = HostSteps(host, host_index, run_dir)
    try:
        return run_loop(steps, plan, run_dir, primary=host.role.is_primary, log=log,
                        began=began)
    except Exception:
        steps.settle()
        raise


def plot_title(plan: ExecutionPlan) -> str:
    """The title of a CO run's reward plot."""
    warmup = plan.algorithm.sft_warmup_steps
    return (f"{plan.workload.name} on {plan.model.config.name}: GRPO steps only"
            + (f" (after {warmup} supervised warm-up steps)" if warmup else ""))

"""The RL loop of one host: local rollout and reward, one global train step per step.

    plan.json ──build_host──> Host (meshes, model, tokenizer, problems, scorer)
    Trainer.start: checkpoint? restore  (else HF weights | random init, SFT warm-up, reference)
    for step in [start, run.steps):
        prompts[range of this host] ──rollout (local mesh, one compiled program)──> completions
            ──reward (this host's scorer)──> rewards_PxG ──advantages (per group)──> rows
            (dynamic sampling: more of its own prompts until its groups carry signal)
        Trainer.train(rows): rows of every host ──> global TrainBatch ──> one jitted step on
            the global mesh ──> NaN guard (a non-finite step stops the run, unsaved) ──> Orbax
            save every checkpoint_every
        Trainer.rollout_weights: on-host reshard (the plan's CO transfer), compute dtype
        stats + SIGTERM/SIGINT flag of every host ──all-gather──> metrics.jsonl, TensorBoard,
            progress bar; a flag on any host: every host saves this step and stops (`Stopped`)
        every eval_every: pass@1 (pass@k, maj@k) on held-out prompts
    end: HF export (run_dir/hf); the primary host: reward/timing plot, summary (co.host)

The single controller (`locojax.single`) runs the same phases with the host work moved to
its driver.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import numpy as np

from compiler.plan import ExecutionPlan
from locojax.runtime.components import Host, build_host
from locojax.runtime.episode import EVAL_STREAM, eval_samples, step_episode, step_key
from locojax.runtime.evaluation import eval_fields
from locojax.runtime.observe.metrics import MetricsWriter
from locojax.runtime.observe.progress import StepProgress
from locojax.runtime.observe.stats import busiest_host, episode_stats
from locojax.runtime.process.distributed import every_host
from locojax.runtime.process.stop import Stopped, StopSignals, agreed_signal, set_phase
from locojax.runtime.rundir.files import HF_DIR
from locojax.runtime.steps import (
    RunSummary,
    eval_due,
    eval_problems,
    metrics_row,
    summarize,
)
from locojax.runtime.trainer import Trainer


def _evaluate(host: Host, local_params, step: int) -> dict[str, float]:
    """Held-out pass@1 (and pass@k, maj@k for run.eval_samples = k > 1) over every host's
    share (each samples and scores its own)."""
    problems = eval_problems(host.workload, host.plan.workload.eval_prompts, host.role.index,
                             host.role.count)
    key = step_key(host.plan.run.seed, step, EVAL_STREAM)
    k = host.plan.run.eval_samples
    sums = every_host(eval_samples(host, local_params, problems, key, k).sums()).sum(axis=0)
    return eval_fields(sums, k)


def _steps(host: Host, host_index: int, trainer: Trainer, first: int, stop: StopSignals,
           progress: StepProgress, metrics_out: MetricsWriter) -> tuple[list[float], dict]:
    """RL steps [first, run.steps): (each step's mean reward, the last metrics row). Raises
    `Stopped` after saving the step at whose end any host had a signal, `NonFinite` (from
    the trainer) at a step that is not finite."""
    plan = host.plan
    local = trainer.rollout_weights()
    rewards_seen: list[float] = []
    row: dict = {}
    for step in range(first, plan.run.steps):
        t0 = time.perf_counter()
        episode = step_episode(host, local, step, host.prompt_range(), host_index)
        t1 = time.perf_counter()
        local = None  # it may alias the master weights, which the step donates
        metrics = trainer.train(step, episode.rows)
        t2 = time.perf_counter()
        local = jax.block_until_ready(trainer.rollout_weights())
        t3 = time.perf_counter()
        t_gather = time.perf_counter()
        # The stop flag rides in the statistics all-gather: every host decides on the same step.
        gathered = every_host(np.append(episode_stats(episode), stop.flag))
        stats, signum = gathered[:, :-1], agreed_signal(gathered[:, -1].tolist())
        work = busiest_host(stats)
        # CO's only host-side exchange: the statistics all-gather (no driver round trips,
        # no scatter: rows never leave their host).
        work.add("gather", time.perf_counter() - t_gather)
        work.gather_bytes = gathered.nbytes
        done = step + 1
        evaluated = {}
        if eval_due(step, plan.run.steps, plan.run.eval_every):
            t_eval = time.perf_counter()
            evaluated = _evaluate(host, local, step)
            evaluated["eval_s"] = time.perf_counter() - t_eval
        row = metrics_row(step, stats, metrics, {"train_s": t2 - t1, "transfer_s": t3 - t2,
                                                 "step_s": time.perf_counter() - t0,
                                                 **work.fields(), **evaluated},
                          tuple(plan.workload.reward_fns))
        metrics_out.write(row)
        rewards_seen.append(row["reward_mean"])
        progress.update(step + 1, reward=row["reward_mean"], step_s=row["step_s"])
        if signum is not None:
            del local
            raise Stopped(signum, done, trainer.save_now(done))
    # One more vote: a signal during the last step's evaluation or row stops before the export.
    signum = agreed_signal(every_host(np.array([stop.flag])).ravel().tolist())
    if signum is not None:
        raise Stopped(signum, plan.run.steps, trainer.save_now(plan.run.steps))
    return rewards_seen, row


def run_host(plan: ExecutionPlan, run_dir: Path, host_index: int, log=print) -> RunSummary:
    """Run the plan's RL loop as host `host_index`; resumes from the run's last checkpoint.
    SIGTERM / SIGINT during the steps: the step in progress finishes and is saved on every
    host, then `Stopped` (see `runtime.process.stop`)."""
    began = time.perf_counter()
    set_phase("start-up")
    host = build_host(plan, host_index)
    primary = host.role.is_primary
    trainer = Trainer(host, run_dir, host.prompt_range(), primary=primary)
    start = trainer.start(log if primary else lambda _: None)
    metrics_out = MetricsWriter(run_dir, enabled=primary, plan=plan)
    metrics_out.truncate_from(start.step)
    try:
        with StopSignals() as stop, StepProgress(plan.run.steps, start_step=start.step,
                                                 enabled=primary) as progress:
            rewards_seen, row = _steps(host, host_index, trainer, start.step, stop, progress,
                                       metrics_out)
    finally:
        metrics_out.close()
    export = trainer.finish(run_dir / HF_DIR)
    host.scorer.close()
    return summarize(rewards_seen, row, start.step, plan.run.steps, time.perf_counter() - began,
                     export=export, sft_loss=start.sft_loss)


def plot_title(plan: ExecutionPlan) -> str:
    """The title of a CO run's reward plot."""
    warmup = plan.algorithm.sft_warmup_steps
    return (f"{plan.workload.name} on {plan.model.config.name}: GRPO steps only"
            + (f" (after {warmup} supervised warm-up steps)" if warmup else ""))

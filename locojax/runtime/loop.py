"""The RL loop of one host: local rollout and reward, one global train step per step.

    plan.json ──build_host──> Host (meshes, model, tokenizer, problems, scorer, jitted steps)
    checkpoint? ──restore──> params, opt_state, start step          (else init + SFT warm-up)
    for step in [start, run.steps):
        prompts[range of this host] ──rollout (local mesh, one compiled program)──> completions
            ──reward (this host's scorer)──> rewards_PxG ──advantages (per group)──> rows
        rows of every host ──make_array_from_process_local_data──> global TrainBatch
            ──train_step (global mesh, plan shardings)──> params, opt_state
        params ──on-host reshard (the plan's CO transfer)──> rollout copy
        stats of every host ──all-gather──> metrics.jsonl, TensorBoard, progress bar
        every checkpoint_every: Orbax save;  every eval_every: greedy pass@1 on held-out prompts
    end: HF export (run_dir/hf), reward/timing plot, summary

Under the single controller one process is "host 0" and drives every device: it rolls out on
all devices and scores every sample itself, with the same data, seeds and algorithm.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

from compiler.plan import ExecutionPlan
from locojax.data import DataPosition, PromptStream, shard
from locojax.model import export_hf_checkpoint
from locojax.runtime.checkpoint import Checkpointer
from locojax.runtime.components import Host, build_host, rollout_params
from locojax.runtime.episode import (
    EVAL_STREAM,
    completions_text,
    run_episode,
    sample,
    sft_rows,
    step_key,
)
from locojax.runtime.metrics import MetricsWriter
from locojax.runtime.plots import plot_run
from locojax.runtime.progress import StepProgress, print_summary
from locojax.runtime.stats import busiest_host, episode_stats, reward_fields
from locojax.train import SftBatch, TrainBatch

SFT_SEED_OFFSET = 1_000_003
FINAL_WINDOW = 10
"""Steps averaged into the reported final reward (one step's mean is noisy)."""


@dataclass(frozen=True)
class RunSummary:
    """What a finished run reports."""

    first_reward: float
    last_reward: float
    last_accuracy: float
    steps: int
    seconds: float
    plot: Path | None
    export: Path | None
    sft_loss: tuple[float, float] | None


def _global_batch(host: Host, rows: dict[str, np.ndarray], cls):
    """The global batch from every process's rows (the single controller holds them all)."""
    def place(x: np.ndarray):
        if jax.process_count() == 1:
            return jax.device_put(x, host.batch_sharding)
        global_shape = (x.shape[0] * jax.process_count(), *x.shape[1:])
        return jax.make_array_from_process_local_data(host.batch_sharding, x, global_shape)

    return cls(**{k: place(v) for k, v in rows.items()})


def _gather(values: np.ndarray) -> np.ndarray:
    """Every host's row of small statistics (hosts x k)."""
    if jax.process_count() == 1:
        return values[None]
    return np.asarray(multihost_utils.process_allgather(values))


def _problems(host: Host, step: int, stream: PromptStream | None = None):
    """This host's problems of `step` (from the RL stream unless another is given)."""
    start, stop = host.prompt_range()
    order = (stream or host.stream).batch(step, start, stop)
    return [host.workload.train[int(i)] for i in order]


def _sft(host: Host, params, log) -> tuple[object, tuple[float, float] | None]:
    """Supervised warm-up on reference solutions (steps numbered before RL's, not logged as RL)."""
    n = host.plan.algorithm.sft_warmup_steps
    if n == 0:
        return params, None
    from locojax.runtime import assemble

    opt_state = host.init_opt_state(params, assemble.sft_optimizer(host.plan.algorithm))
    # Its own seed stream, so the RL phase sees the same prompts with or without a warm-up.
    stream = PromptStream(len(host.workload.train), host.plan.batch.prompts_per_step,
                          DataPosition(host.plan.run.seed + SFT_SEED_OFFSET))
    losses = []
    for i in range(n):
        batch = _global_batch(host, sft_rows(host, _problems(host, i, stream)), SftBatch)
        params, opt_state, metrics = host.sft_step(params, opt_state, batch)
        losses.append(float(metrics["loss"]))
    log(f"supervised warm-up: {n} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return params, (losses[0], losses[-1])


def _reference(host: Host, seed: int):
    """The frozen reference policy: initial parameters after the supervised warm-up."""
    params, _ = _sft(host, host.init_params(seed), lambda _: None)
    return params


def _evaluate(host: Host, local_params, step: int) -> float:
    """Greedy pass@1 on held-out prompts, averaged over hosts."""
    n = min(len(host.workload.eval), host.plan.workload.eval_prompts)
    problems = list(host.workload.eval[:n])
    if not host.role.drives_all:
        problems = shard(problems, host.role.index, host.role.count)
    out, _ = sample(host, local_params, problems, host.greedy, step_key(host.plan.run.seed, step, EVAL_STREAM),
                    1)
    rewards = host.scorer.score_batch(completions_text(host, out), [p.answer for p in problems])
    stats = _gather(np.array([rewards.correct_B.sum(), len(problems)], np.float64)).sum(axis=0)
    return float(stats[0] / max(stats[1], 1))


def _row(step: int, stats: np.ndarray, metrics: dict, times: dict) -> dict:
    """One metrics.jsonl row from the all-gathered host statistics and the train metrics."""
    row = {
        **reward_fields(step, stats),
        **{k: float(metrics[k]) for k in ("loss", "kl", "entropy", "clip_frac", "grad_norm", "lr")
           if k in metrics},
        **times,
    }
    row.setdefault("kl", 0.0)
    parts = ("rollout_s", "reward_s", "advantage_s", "train_s", "transfer_s")
    row["host_other_s"] = max(row["step_s"] - sum(row[k] for k in parts), 0.0)
    row["tokens_per_s"] = row["tokens"] / row["step_s"]
    return row


def run_host(plan: ExecutionPlan, run_dir: Path, host_index: int, log=print) -> RunSummary:
    """Run the plan's RL loop as host `host_index`; resumes from the run's last checkpoint."""
    began = time.perf_counter()
    host = build_host(plan, host_index)
    primary = host.role.is_primary
    seed, steps = plan.run.seed, plan.run.steps
    ckpt = Checkpointer(run_dir / "checkpoints")
    params = host.init_params(seed)
    opt_state = host.init_opt_state(params, host.grpo.optimizer)
    start, params, opt_state, _ = ckpt.restore_latest(params, opt_state,
                                                      log if primary else lambda _: None)
    sft_loss = None
    if start:
        log(f"resumed from the checkpoint of step {start}")
    else:
        params, sft_loss = _sft(host, params, log if primary else lambda _: None)
    # The KL reference is the policy RL starts from (after the warm-up); a resumed run
    # rebuilds it the same way, so it is not checkpointed.
    reference = _reference(host, seed) if host.ref_logprobs is not None else None
    metrics_out = MetricsWriter(run_dir, enabled=primary)
    metrics_out.truncate_from(start)
    local = rollout_params(host, params)
    rewards_seen: list[float] = []
    row: dict = {}
    with StepProgress(steps, start_step=start, enabled=primary) as progress:
        for step in range(start, steps):
            t0 = time.perf_counter()
            episode = run_episode(host, local, _problems(host, step), step_key(seed, step,
                                                                           host_index))
            t1 = time.perf_counter()
            batch = _global_batch(host, episode.rows, TrainBatch)
            if reference is not None:
                ref = host.ref_logprobs(reference, batch.tokens_BxL, batch.positions_BxL,
                                        batch.valid_BxL)
                batch = dataclasses.replace(batch, ref_logp_BxL=ref)
            params, opt_state, metrics = host.train_step(params, opt_state, batch)
            metrics = jax.device_get(metrics)
            t2 = time.perf_counter()
            local = jax.block_until_ready(rollout_params(host, params))
            t3 = time.perf_counter()
            t_gather = time.perf_counter()
            stats = _gather(episode_stats(episode))
            work = busiest_host(stats)
            # CO's only host-side exchange: the statistics all-gather (no driver round trips,
            # no scatter: rows never leave their host).
            work.add("gather", time.perf_counter() - t_gather)
            work.gather_bytes = stats.nbytes
            done = step + 1
            if plan.run.eval_every and (done % plan.run.eval_every == 0 or done == steps):
                eval_pass1 = _evaluate(host, local, step)
            else:
                eval_pass1 = None
            every = plan.run.checkpoint_every  # 0: only at the end
            if done == steps or (every and done % every == 0):
                ckpt.save(done, params, opt_state, {"step": done, "seed": seed})
            t4 = time.perf_counter()
            row = _row(step, stats, metrics, {"train_s": t2 - t1, "transfer_s": t3 - t2,
                                              "step_s": t4 - t0, **work.fields()})
            if eval_pass1 is not None:
                row["eval_pass1"] = eval_pass1
            metrics_out.write(row)
            rewards_seen.append(row["reward_mean"])
            progress.update(done, reward=row["reward_mean"], step_s=row["step_s"])
    ckpt.wait()
    ckpt.close()
    metrics_out.close()
    plot = export = None
    if primary:
        export = export_hf_checkpoint(host.arch, jax.device_get(local), run_dir / "hf")
        warmup = plan.algorithm.sft_warmup_steps
        title = (f"{plan.workload.name} on {plan.model.config.name}: GRPO steps only"
                 + (f" (after {warmup} supervised warm-up steps)" if warmup else ""))
        plot = plot_run(run_dir / "metrics.jsonl", run_dir / "rewards.png", title=title)
    host.scorer.close()
    return RunSummary(
        first_reward=rewards_seen[0] if rewards_seen else float("nan"),
        last_reward=float(np.mean(rewards_seen[-FINAL_WINDOW:])) if rewards_seen else float("nan"),
        last_accuracy=row.get("accuracy", float("nan")),
        steps=steps - start, seconds=time.perf_counter() - began, plot=plot, export=export,
        sft_loss=sft_loss,
    )


def report(summary: RunSummary, run_dir: Path) -> None:
    """End-of-run summary table (primary host)."""
    rows = [
        ("steps run", str(summary.steps)),
        ("reward (first step -> mean of last 10)",
         f"{summary.first_reward:.3f} -> {summary.last_reward:.3f}"),
        ("accuracy (last step)", f"{summary.last_accuracy:.3f}"),
        ("wall time", f"{summary.seconds:.1f} s"),
        ("metrics", str(run_dir / "metrics.jsonl")),
        ("plot", str(summary.plot)),
        ("final policy (HF)", str(summary.export)),
    ]
    if summary.sft_loss is not None:
        rows.insert(1, ("supervised warm-up loss", f"{summary.sft_loss[0]:.3f} -> "
                                                   f"{summary.sft_loss[1]:.3f} (before RL)"))
    print_summary(rows, "LoCoJAX run")

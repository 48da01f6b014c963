"""One host of the single controller: a Ray actor that owns the host's devices.

It samples what the driver sends it, trains its rows of the global batch through the one
`Trainer` (every worker is a process of one `jax.distributed` group, as CO's hosts are), and
refreshes its rollout weights. It never scores, normalises or decides anything: those are
the driver's. The driver imports this module (which loads JAX, as DA's actors do, but starts no
backend) and never runs its methods: devices and programs are built in the actor, whose
runtime_env set its device flags before it started.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import ray

from compiler import plan_from_json
from compiler.axes import MeshAxis
from locojax.episodes.keys import StepKeys
from locojax.runtime.components import build_host
from locojax.runtime.episode import (
    episode_caches,
    episode_slots,
    generate_prompts,
)
from locojax.runtime.hostwork import Completions, Prompts
from locojax.runtime.observe.compiles import COMPILES
from locojax.runtime.process.distributed import init_distributed
from locojax.runtime.rundir.files import HF_DIR
from locojax.runtime.trainer import Trainer
from locojax.runtime.turns import cached_turn, reply_settings, wave_rows
from locojax.single.messages import Generated, Trained, WorkerReady


def _timed(fn, *args) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def _steps(caches) -> tuple[int, int]:
    """The decode loops' (rows x steps, running rows' steps) of a batch's caches so far."""
    return (sum(c.slot_steps for c in caches), sum(c.live_steps for c in caches))


def _padded(prompts: Prompts, fill: int) -> Prompts:
    """`prompts` with `fill` copies of its first row appended (decoded, never scored)."""
    if not fill:
        return prompts
    return Prompts(np.concatenate([prompts.ids_BxP, np.repeat(prompts.ids_BxP[:1], fill, 0)]),
                   np.concatenate([prompts.len_B, np.repeat(prompts.len_B[:1], fill)]),
                   prompts.truncated)


def _eval_rows(prompts: Prompts, replicas: int, new_tokens: int, k: int,
               generate: Callable[[Prompts], Completions]) -> Completions:
    """k evaluation completions per prompt: the prompts padded to a multiple of `replicas`
    (their rows split over the rollout replicas; CO's eval_samples pads too) and cut back. A
    share of no prompts (eval_prompts < hosts) samples nothing: no rows, at the widths of the
    others'."""
    n = len(prompts.len_B)
    if not n:
        width, t = prompts.ids_BxP.shape[1], new_tokens
        return Completions(tokens_BxL=np.zeros((0, width + t), np.int32),
                           mask_BxT=np.zeros((0, t), bool),
                           logp_model_BxT=np.zeros((0, t), np.float32),
                           logp_BxT=np.zeros((0, t), np.float32),
                           lengths_B=np.zeros(0, np.int32), prompt_len_B=np.zeros(0, np.int32))
    return generate(_padded(prompts, -n % replicas)).rows(0, n * k)


class HostWorker:
    """The devices, rollout weights and training state of one host."""

    def __init__(self, plan_json: str, host_index: int, run_dir: str):
        self.plan = plan_from_json(plan_json)
        if self.plan.topology.hosts > 1:
            init_distributed(self.plan.controller.heartbeat_timeout_s)
        self.host_index, self.run_dir = host_index, Path(run_dir)
        self.host = build_host(self.plan, host_index, turns=False)  # the driver runs them
        self.trainer = Trainer(self.host, Path(run_dir), self.host.prompt_range(),
                               primary=host_index == 0)
        self.local = None
        """The rollout copy of the weights (compute dtype, whole on this host's devices)."""
        self.reply = reply_settings(self.plan, self.host.sampling)
        """Sampling settings of one turn of a multi-turn episode."""
        self.episodes = None
        """The KV caches of this host's episodes of the batch being run (`turn`)."""

    def pid(self) -> int:
        """This actor's process id."""
        return os.getpid()

    def setup(self) -> WorkerReady:
        """Restore or initialise (and warm up) the policy; every worker at once."""
        lines: list[str] = []
        start = self.trainer.start(log=lines.append)
        self.local = self.trainer.rollout_weights()
        return WorkerReady(start=start.step, source=start.source, sft_loss=start.sft_loss,
                           log=tuple(lines))

    def generate(self, step: int, prompt_refs: list, greedy: bool = False,
                 batch: int = 0) -> Generated:
        """Sample G completions per prompt of `step`, with CO's per-host key (its `batch`-th
        batch's under dynamic sampling; `greedy`: the evaluation's run.eval_samples, greedy
        for 1, with CO's evaluation key).

        Returns the execution time (the driver subtracts it from its round trip), the time to
        fetch the prompts and to put the completions into the object store, and the
        completions' reference (the driver gathers them)."""
        t0 = time.perf_counter()
        prompts, fetch_s = _timed(ray.get, prompt_refs[0])
        seed, group = self.plan.run.seed, self.plan.batch.group_size
        k = self.plan.run.eval_samples
        settings, key = ((self.host.greedy if k == 1 else self.host.sampling,
                          StepKeys(seed, step).evaluation()) if greedy
                         else (self.host.sampling,
                               StepKeys(seed, step).sampling(self.host_index, batch)))

        def sampled(p: Prompts) -> Completions:
            return Completions.of(jax.device_get(generate_prompts(
                self.host, self.local, p, settings, key, k if greedy else group)))

        t1 = time.perf_counter()
        out = (_eval_rows(prompts, self.host.model.rollout_mesh.shape[MeshAxis.REPLICA],
                          settings.max_new_tokens, k, sampled) if greedy else sampled(prompts))
        t2 = time.perf_counter()
        ref, put_s = _timed(ray.put, out)
        return Generated(exec_s=time.perf_counter() - t0, rollout_s=t2 - t1, fetch_s=fetch_s,
                         put_s=put_s, bytes=out.nbytes, completions=[ref])

    def turn(self, step: int, prompt_refs: list, batch: int, turn: int,
             eval_k: int = 0, wave: int = 0) -> Generated:
        """One turn of this host's multi-turn episodes of `step` (its `batch`-th batch; with
        `eval_k`, the evaluation's, greedy for 1, at the evaluation's key): one reply after
        each episode's new tokens, with CO's key of that turn (`episodes.keys.turn_key`), the
        episodes' KV caches kept here from turn 0 on (`wave`: which of the batch's waves;
        `runtime.turns.cached_turn`)."""
        t0 = time.perf_counter()
        prompts, fetch_s = _timed(ray.get, prompt_refs[0])
        settings, key = self._turn_sampling(step, batch, eval_k)
        t1 = time.perf_counter()
        if turn == 0 and wave == 0:  # a batch's first call (its waves' turns follow)
            self.episodes = episode_caches(self.host, self.local, settings)
        before = _steps(self.episodes)
        out = cached_turn(self.episodes, key, wave_rows(self.plan), prompts, turn, wave)
        return self._answer(out, out.nbytes, before, t0, t1, fetch_s)

    def advance(self, step: int, feed_refs: list, batch: int, eval_k: int = 0,
                begin: bool = False) -> Generated:
        """`runtime.turns.Advance` on this host's slots (`sampling.schedule=refill`): the
        fed slots' tokens (`rollout.episodes.Feed`, slots of this host) and a chunk of decode
        steps, with CO's key of the batch (`turn`'s settings and keys); the replies that
        ended, slot -> (ids, logp, logp_model). `begin`: the batch's first call, which makes
        the slots (`runtime.episode.episode_slots`)."""
        t0 = time.perf_counter()
        feeds, fetch_s = _timed(ray.get, feed_refs[0])
        settings, key = self._turn_sampling(step, batch, eval_k)
        t1 = time.perf_counter()
        if begin:
            self.episodes = (episode_slots(self.host, self.local, settings),)
        before = _steps(self.episodes)
        ended = self.episodes[0].advance(feeds, key, self.plan.sampling.decode_chunk)
        return self._answer(ended, sum(x.nbytes for r in ended.values() for x in r), before,
                            t0, t1, fetch_s)

    def _answer(self, out, nbytes: int, before: tuple[int, int], t0: float, t1: float,
                fetch_s: float) -> Generated:
        """A turn's or chunk's `out` into the object store, with the call's seconds (`t0`:
        its start, `t1`: the generation's) and the decode steps since `before`."""
        t2 = time.perf_counter()
        ref, put_s = _timed(ray.put, out)
        slot_steps, live_steps = np.subtract(_steps(self.episodes), before).tolist()
        return Generated(exec_s=time.perf_counter() - t0, rollout_s=t2 - t1, fetch_s=fetch_s,
                         put_s=put_s, bytes=nbytes, completions=[ref],
                         slot_steps=slot_steps, live_steps=live_steps)

    def _turn_sampling(self, step: int, batch: int, eval_k: int):
        """(settings, key) of a batch's turns: one reply at the plan's sampling with CO's
        per-host key of its `batch`-th batch, or (`eval_k`) the evaluation's, greedy for 1."""
        seed = self.plan.run.seed
        if eval_k:
            base = self.host.greedy if eval_k == 1 else self.host.sampling
            settings = dataclasses.replace(base, max_new_tokens=self.reply.max_new_tokens)
            return settings, StepKeys(seed, step).evaluation()
        return self.reply, StepKeys(seed, step).sampling(self.host_index, batch)

    def train(self, step: int, row_refs: list) -> Trained:
        """One global GRPO step on this host's rows, then the refreshed rollout weights."""
        t0 = time.perf_counter()
        rows, fetch_s = _timed(ray.get, row_refs[0])
        t1 = time.perf_counter()
        self.local = None  # it may alias the master weights, which the step donates
        metrics = self.trainer.train(step, rows)
        t2 = time.perf_counter()
        self.local = jax.block_until_ready(self.trainer.rollout_weights())
        t3 = time.perf_counter()
        return Trained(exec_s=t3 - t0, fetch_s=fetch_s, train_s=t2 - t1, transfer_s=t3 - t2,
                       metrics=metrics, compiles=COMPILES.take())

    def save_now(self, done: int) -> str:
        """Save the state after `done` steps and wait for it (a stop on a signal)."""
        return str(self.trainer.save_now(done))

    def finish(self) -> str | None:
        """Wait for checkpoints; worker 0 exports the final policy (every worker calls it)."""
        self.local = None
        export = self.trainer.finish(self.run_dir / HF_DIR)
        return None if export is None else str(export)

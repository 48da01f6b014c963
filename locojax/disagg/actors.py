"""The two Ray actor classes of DA: one per rollout host and one per trainer host.

This module is imported by the driver, which must not start JAX with the actors' device
flags, so JAX and everything that imports it are imported inside the methods: each actor
process gets its XLA_FLAGS / JAX_PLATFORMS from its Ray runtime_env before that import.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import ray


def _key(seed: int, step: int, stream: int):
    """CO's per-step, per-host key (imported here: the driver must not import JAX)."""
    from locojax.runtime.episode import step_key

    return step_key(seed, step, stream)


def _flat_numpy(params) -> dict[str, np.ndarray]:
    """'/'-joined name -> full host copy of every parameter (all-gathered when multi-process)."""
    import jax
    from jax.experimental import multihost_utils

    from locojax.model import flat_params

    flat = {name: var[...] for name, var in flat_params(params).items()}
    if jax.process_count() > 1:
        flat = multihost_utils.process_allgather(flat, tiled=True)
    return {name: np.asarray(x) for name, x in flat.items()}


class RolloutActor:
    """Samples, scores and builds train rows for its prompt range with the weights it holds."""

    def __init__(self, plan_json: str, host_index: int):
        from compiler import plan_from_json
        from locojax.disagg.roles import rollout_prompt_range
        from locojax.disagg.transfer import SliceAssembler
        from locojax.model import abstract_model, flat_params
        from locojax.runtime.components import build_host

        self.plan = plan_from_json(plan_json)
        self.host_index = host_index
        self.host = build_host(self.plan, host_index, trains=False)
        self.range = rollout_prompt_range(self.plan, host_index)
        abstract = flat_params(abstract_model(self.host.arch)[1])
        self._assembler = SliceAssembler({n: v.shape for n, v in abstract.items()},
                                         {n: np.dtype(v.dtype) for n, v in abstract.items()},
                                         self.plan.transfer.slices)
        self._lock = threading.Lock()
        self._ready: tuple[int, dict] | None = None
        self.params, self.version = None, -1

    def pid(self) -> int:
        """This actor's process id (the fault test kills it)."""
        return os.getpid()

    @ray.method(concurrency_group="transfer")
    def receive(self, version: int, index: int, refs: list) -> int:
        """Fetch one slice of `version` (runs beside a generation); returns the bytes kept."""
        pieces = ray.get(refs[0])
        with self._lock:
            got = self._assembler.add(version, index, pieces)
            if self._assembler.complete:
                self._ready = (version, self._assembler.assemble())
        return got

    def _swap(self) -> None:
        """Take the newest complete weights; only ever called between generations."""
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        from locojax.model import params_from_flat

        with self._lock:
            ready, self._ready = self._ready, None
        if ready is not None and ready[0] > self.version:
            params = params_from_flat(self.host.arch, ready[1])
            self.params = jax.device_put(params, NamedSharding(self.host.rollout_mesh, P()))
            self.version = ready[0]
        if self.params is None:
            raise RuntimeError(f"rollout host {self.host_index} has no weights yet")

    @ray.method(num_returns=2)
    def rollout(self, step: int):
        """(meta, rows) of this host's prompts of `step`; meta says which version sampled."""
        from locojax.runtime.episode import run_episode
        from locojax.runtime.stats import episode_stats

        t0 = time.time()
        self._swap()
        start, stop = self.range
        order = self.host.stream.batch(step, start, stop)
        problems = [self.host.workload.train[int(i)] for i in order]
        ep = run_episode(self.host, self.params, problems,
                         _key(self.plan.run.seed, step, self.host_index))
        stats = episode_stats(ep).tolist()
        meta = {"host": self.host_index, "step": step, "version": self.version,
                "t_start": t0, "t_end": time.time(), "stats": stats}
        return meta, ep.rows

    def evaluate(self, step: int) -> tuple[float, int, int]:
        """(correct, prompts, version): greedy pass@1 on this host's share of held-out prompts."""
        from locojax.data import shard
        from locojax.runtime.episode import EVAL_STREAM, greedy_correct

        self._swap()
        plan, host = self.plan, self.host
        problems = list(host.workload.eval[:min(len(host.workload.eval),
                                                plan.workload.eval_prompts)])
        hosts = plan.partitions.rollout_hosts
        problems = shard(problems, hosts.index(self.host_index), len(hosts))
        key = _key(plan.run.seed, step, EVAL_STREAM)
        correct = greedy_correct(host, self.params, problems, key)
        return correct, len(problems), self.version


class TrainerActor:
    """One trainer host: a JAX process of the trainer group, owner of the optimizer state."""

    def __init__(self, plan_json: str, host_index: int, rank: int, run_dir: str):
        from compiler import plan_from_json

        self.plan = plan_from_json(plan_json)
        if len(self.plan.partitions.trainer_hosts) > 1:
            from locojax.runtime.distributed import init_distributed

            init_distributed(self.plan.controller.heartbeat_timeout_s)
        from locojax.runtime.checkpoint import Checkpointer
        from locojax.runtime.components import build_host

        self.host_index, self.rank, self.run_dir = host_index, rank, Path(run_dir)
        self.host = build_host(self.plan, host_index, trains=True)
        self.ckpt = Checkpointer(self.run_dir / "checkpoints")
        self.params = self.opt_state = self.reference = None

    def pid(self) -> int:
        """This actor's process id."""
        return os.getpid()

    def _problems(self, step: int, stream):
        """This trainer's share of the step's prompts (SFT rows are fed per process)."""
        n, p = self.plan.batch.prompts_per_step, len(self.plan.partitions.trainer_hosts)
        order = stream.batch(step, n * self.rank // p, n * (self.rank + 1) // p)
        return [self.host.workload.train[int(i)] for i in order]

    def _global(self, rows: dict, cls):
        """The global batch from this process's rows."""
        import jax

        def place(x):
            if jax.process_count() == 1:
                return jax.device_put(x, self.host.batch_sharding)
            shape = (x.shape[0] * jax.process_count(), *x.shape[1:])
            return jax.make_array_from_process_local_data(self.host.batch_sharding, x, shape)

        return cls(**{k: place(v) for k, v in rows.items()})

    def _sft(self, params):
        """Supervised warm-up (as CO's), returning (params, (first, last) loss or None)."""
        from locojax.data import DataPosition, PromptStream
        from locojax.runtime import assemble
        from locojax.runtime.episode import sft_rows
        from locojax.runtime.loop import SFT_SEED_OFFSET
        from locojax.train import SftBatch

        n = self.plan.algorithm.sft_warmup_steps
        if n == 0:
            return params, None
        opt_state = self.host.init_opt_state(params, assemble.sft_optimizer(self.plan.algorithm))
        stream = PromptStream(len(self.host.workload.train), self.plan.batch.prompts_per_step,
                              DataPosition(self.plan.run.seed + SFT_SEED_OFFSET))
        losses = []
        for i in range(n):
            batch = self._global(sft_rows(self.host, self._problems(i, stream)), SftBatch)
            params, opt_state, metrics = self.host.sft_step(params, opt_state, batch)
            losses.append(float(metrics["loss"]))
        return params, (losses[0], losses[-1])

    def setup(self) -> dict:
        """Initial or restored state; returns the step to start at and the warm-up losses."""
        seed = self.plan.run.seed
        self.params = self.host.init_params(seed)
        self.opt_state = self.host.init_opt_state(self.params, self.host.grpo.optimizer)
        start, self.params, self.opt_state, _ = self.ckpt.restore_latest(
            self.params, self.opt_state, print if self.rank == 0 else lambda _: None)
        sft_loss = None
        if not start:
            self.params, sft_loss = self._sft(self.params)
        if self.host.ref_logprobs is not None:
            self.reference = self._sft(self.host.init_params(seed))[0]
        return {"start": start, "sft_loss": sft_loss}

    def train(self, step: int, row_refs: list) -> dict:
        """One GRPO update on the rows of every rollout host (host order) -> version step+1."""
        import dataclasses

        import jax

        from locojax.disagg.roles import trainer_row_range
        from locojax.train import TrainBatch

        parts = ray.get(row_refs)
        t0 = time.time()
        rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        lo, hi = trainer_row_range(self.plan, self.rank, len(rows["advantages_B"]))
        batch = self._global({k: v[lo:hi] for k, v in rows.items()}, TrainBatch)
        if self.reference is not None:
            ref = self.host.ref_logprobs(self.reference, batch.tokens_BxL, batch.positions_BxL,
                                         batch.valid_BxL)
            batch = dataclasses.replace(batch, ref_logp_BxL=ref)
        self.params, self.opt_state, metrics = self.host.train_step(self.params, self.opt_state,
                                                                    batch)
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items() if np.ndim(v) == 0}
        done, every = step + 1, self.plan.run.checkpoint_every
        if done == self.plan.run.steps or (every and done % every == 0):  # 0: only at the end
            self.ckpt.save(done, self.params, self.opt_state, {"step": done,
                                                               "seed": self.plan.run.seed})
        return {"metrics": metrics, "t_start": t0, "t_end": time.time()}

    def publish(self, version: int) -> dict:
        """Cut this host's slices of the current weights into the object store."""
        from locojax.disagg.transfer import cut_slice

        flat = _flat_numpy(self.params)
        mine = sorted({s.slice for r in self.plan.transfer.rounds for s in r
                       if s.src == self.host_index})
        return {(self.host_index, i): ray.put(cut_slice(flat, self.plan.transfer.slices[i]))
                for i in mine}

    def last_checkpoint(self) -> int | None:
        """Newest fully written checkpoint step."""
        return self.ckpt.latest_step()

    def finish(self) -> str | None:
        """Wait for checkpoints; the rank-0 trainer exports the final policy (HF)."""
        from locojax.model import export_hf_checkpoint, params_from_flat

        self.ckpt.wait()
        self.ckpt.close()
        flat = _flat_numpy(self.params)  # collective: every trainer calls finish
        if self.rank != 0:
            return None
        params = params_from_flat(self.host.arch, flat)
        return str(export_hf_checkpoint(self.host.arch, params, self.run_dir / "hf"))

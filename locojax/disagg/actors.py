"""The two Ray actor classes of DA: one per rollout host and one per trainer host.

Each actor process gets its XLA_FLAGS / JAX_PLATFORMS from its Ray runtime_env when Ray starts
it, before it imports this module; the driver imports it too, which only loads JAX: no module
here starts a backend at import (the driver never does).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import ray

from compiler import plan_from_json
from locojax.disagg.messages import EvalDone, RolloutDone, TrainDone, TrainerReady
from locojax.disagg.roles import rollout_prompt_range, trainer_row_range
from locojax.disagg.timeline import Interval
from locojax.disagg.transfer import SliceAssembler, SliceKey, cut_slice
from locojax.episodes.keys import StepKeys
from locojax.runtime.components import build_host, rollout_shardings
from locojax.runtime.episode import eval_samples, step_episode
from locojax.runtime.observe.stats import HostStats
from locojax.runtime.process.distributed import init_distributed
from locojax.runtime.rundir.files import HF_DIR
from locojax.runtime.steps import eval_problems
from locojax.runtime.trained import trained
from locojax.runtime.trainer import Trainer


class RolloutActor:
    """Samples, scores and builds train rows for its prompt range with the weights it holds."""

    def __init__(self, plan_json: str, host_index: int):
        self.plan = plan_from_json(plan_json)
        self.host_index = host_index
        self.host = build_host(self.plan, host_index, trains=False)
        self.range = rollout_prompt_range(self.plan, host_index)
        self.split = trained(self.host)
        """What the trainer trains; with LoRA the transfers carry adapters only, merged here
        onto the frozen base that `attach` reads (compute dtype)."""
        self.split.attach()
        abstract = self.split.transfer_shapes()
        dtype = np.dtype(jnp.dtype(self.host.model.compute_dtype))  # slices: the compute dtype
        self._assembler = SliceAssembler({n: v.shape for n, v in abstract.items()},
                                         dict.fromkeys(abstract, dtype),
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
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is not None and ready[0] > self.version:
            params = self.split.from_transfer(ready[1])
            self.params = jax.device_put(params, rollout_shardings(self.host, params))
            self.version = ready[0]
        if self.params is None:
            raise RuntimeError(f"rollout host {self.host_index} has no weights yet")

    @ray.method(num_returns=2)
    def rollout(self, step: int) -> tuple[RolloutDone, dict[str, np.ndarray]]:
        """(done, rows) of this host's prompts of `step`; `done` says which version sampled."""
        t0 = time.time()
        self._swap()
        ep = step_episode(self.host, self.params, step, self.range, self.host_index)
        done = RolloutDone(host=self.host_index, step=step, version=self.version,
                           sampled=Interval(t0, time.time()), stats=HostStats.of(ep))
        return done, ep.rows

    def evaluate(self, step: int) -> EvalDone:
        """Held-out pass@1 (pass@k, maj@k) on this host's share of the prompts."""
        t0 = time.time()
        self._swap()
        plan, host = self.plan, self.host
        hosts = plan.partitions.rollout_hosts
        problems = eval_problems(host.data.workload, plan.workload.eval_prompts,
                                 hosts.index(self.host_index), len(hosts))
        key = StepKeys(plan.run.seed, step).evaluation()
        sums = eval_samples(host, self.params, problems, key, plan.run.eval_samples).sums()
        return EvalDone(sums=tuple(float(x) for x in sums), version=self.version,
                        seconds=time.time() - t0)


class TrainerActor:
    """One trainer host: a JAX process of the trainer group, driving the shared `Trainer`."""

    def __init__(self, plan_json: str, host_index: int, rank: int, run_dir: str):
        self.plan = plan_from_json(plan_json)
        if len(self.plan.partitions.trainer_hosts) > 1:
            init_distributed(self.plan.controller.heartbeat_timeout_s)
        self.host_index, self.rank, self.run_dir = host_index, rank, Path(run_dir)
        self.host = build_host(self.plan, host_index, trains=True, turns=False)
        n, p = self.plan.batch.prompts_per_step, len(self.plan.partitions.trainer_hosts)
        self.trainer = Trainer(self.host, self.run_dir, (n * rank // p, n * (rank + 1) // p),
                               primary=rank == 0)

    def pid(self) -> int:
        """This actor's process id."""
        return os.getpid()

    def setup(self) -> TrainerReady:
        """Initial or restored state: the step to start at, the warm-up losses and the lines
        the start logged (the driver prints the first trainer's)."""
        lines: list[str] = []
        start = self.trainer.start(log=lines.append)
        return TrainerReady(start=start.step, sft_loss=start.sft_loss, log=tuple(lines))

    def train(self, step: int, row_refs: list) -> TrainDone:
        """One GRPO update on the rows of every rollout host (host order) -> version step+1."""
        parts = ray.get(row_refs)
        t0 = time.time()
        rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        lo, hi = trainer_row_range(self.plan, self.rank, len(rows["advantages_B"]))
        metrics = self.trainer.train(step, {k: v[lo:hi] for k, v in rows.items()})
        return TrainDone(metrics=metrics, trained=Interval(t0, time.time()))

    def publish(self, version: int) -> dict[SliceKey, object]:
        """Cut this host's slices of the current weights (compute dtype) into the object store."""
        flat, slices = self.trainer.host_copy(), self.plan.transfer.slices
        mine = sorted({s.slice for r in self.plan.transfer.rounds for s in r
                       if s.src == self.host_index})
        return {SliceKey(self.host_index, i): ray.put(cut_slice(flat, slices[i])) for i in mine}

    def save_now(self, done: int) -> str:
        """Save the state after `done` steps and wait for it (a stop on a signal)."""
        return str(self.trainer.save_now(done))

    def last_checkpoint(self) -> int | None:
        """Newest fully written checkpoint step."""
        return self.trainer.checkpoints.latest_step()

    def finish(self) -> str | None:
        """Wait for checkpoints; the rank-0 trainer exports the final policy (HF)."""
        export = self.trainer.finish(self.run_dir / HF_DIR)  # collective where shards span hosts
        return None if export is None else str(export)

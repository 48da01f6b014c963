"""One trainer for every mode: the training side of a CO host, of the single controller and
of a DA trainer actor. A mode differs only in who calls it and where the rows come from.

    trainer = Trainer(host, run_dir, sft_range=(start, stop), primary=...)
    trainer.start(log) -> Start
        the run's newest Orbax checkpoint that restores (Checkpointer.restore_latest: a
                                            damaged newer step is logged and set aside)?
                                            a step of another format or configuration is
                                            refused (its meta: `preflight.check_step_meta`);
                                            restore it (master weights, AdamW moments) and
                                            the saved reference; it wins over
                                            model.checkpoint, and one log line says so
        else  initial weights: model.checkpoint (HF, read onto the training shardings)
                               | random init from run.seed
              -> SFT warm-up (algorithm.sft_warmup_steps, its own optimizer state)
              -> reference (kl_coef > 0): these weights in the compute dtype, kept for the
                 whole run and saved once under <run>/reference (never trained again)
        LoRA (algorithm.lora.rank > 0): the base (model.checkpoint | the seed's init) is
              frozen in the compute dtype, the trained params are the adapters (B = 0), the
              reference is the base itself; checkpoints hold adapters + moments + the
              base's fingerprint (a resume on another base is refused). The warm-up trains
              the adapters (algorithm.lora.warmup=adapters) or the whole model (full: the
              warmed model, in the compute dtype, is then the base, saved once under
              <run>/reference and restored from there on resume; its optimizer state is
              dropped after the warm-up)
    trainer.train(step, rows) -> metrics
        this process's rows -> global TrainBatch -> rescore (pi_old recomputed when
        algorithm.old_forward: recompute with several updates per batch, else the step takes
        it from its own forward; reference log-probs when kl_coef > 0: one program)
        -> one jitted GRPO step -> NaN guard (loss, grad_norm, params_finite of the metrics
        fetched anyway; a bad step raises `NonFinite` and is never saved) -> Orbax save when
        run.checkpoint_every says so (every N steps and after the last; 0: after the last only)
    trainer.save(done)          Orbax save of the state after `done` steps (also on demand)
    trainer.save_now(done)      the same, waited for (a stop on SIGTERM / SIGINT) -> its dir
    trainer.rollout_weights()   compute-dtype weights, whole on this process's rollout mesh
    trainer.host_copy()         {name: numpy} in the compute dtype (DA transfer slices; LoRA:
                                the adapters only)
    trainer.finish(export_dir)  wait for saves; HF export at model.export_dtype, with the
                                tokenizer and generation config (primary; rundir.export);
                                LoRA: the merged policy, and the adapters in PEFT's layout
                                under <export_dir>/lora

Every process of the training group makes the same calls in the same order (the steps and
saves are collective). What is trained, the whole model or LoRA adapters on a frozen base,
is the split's (`runtime.trained`): the trainer tests no LoRA condition; the programs are
`runtime.train_programs`', the warm-up's loop `runtime.warmup`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from locojax.runtime.components import Host
from locojax.runtime.errors import NonFinite
from locojax.runtime.guard import non_finite, stop_line
from locojax.runtime.process.stop import atomic
from locojax.runtime.rundir.checkpoint import Checkpointer
from locojax.runtime.rundir.export import export_policy
from locojax.runtime.rundir.files import (
    CHECKPOINTS_DIR,
    REFERENCE_DIR,
    export_staging,
    publish_export,
)
from locojax.runtime.rundir.preflight import check_step_meta, step_meta
from locojax.runtime.train_programs import abstract_state, global_batch, make_steps
from locojax.runtime.trained import abstract_params, trained
from locojax.runtime.warmup import warm_up
from locojax.runtime.weights import cast, host_copy, initial_params, locally_whole, rollout_params
from locojax.train import TrainBatch, init_opt_state, make_optimizer
from locojax.train.batch import shuffled_rows


@dataclass(frozen=True)
class Start:
    """Where training starts."""

    step: int
    """First RL step to run (0 for a fresh run)."""
    source: str
    """Where the weights came from: 'checkpoint of step N', 'model.checkpoint=<dir>' or
    'random init (run.seed=N)'."""
    sft_loss: tuple[float, float] | None
    """First and last supervised warm-up loss; None when there was none (or on resume)."""


class Trainer:
    """The policy's training state on this process and the phases that change it."""

    def __init__(self, host: Host, run_dir: Path, sft_range: tuple[int, int], primary: bool):
        self.host, self.plan = host, host.plan
        self.primary = primary
        """Writes the final export (CO: host 0; DA: the first trainer)."""
        self.sft_range = sft_range
        """[start, stop) of each warm-up step's prompts this process feeds."""
        self.steps = make_steps(host)
        self.checkpoints = Checkpointer(Path(run_dir) / CHECKPOINTS_DIR)
        self._meta = step_meta(self.plan)
        """Format and configuration fingerprint every saved step carries."""
        self._reference_dir = Path(run_dir) / REFERENCE_DIR
        self.params: Any = None
        self.opt_state: Any = None
        self.reference: Any = None
        """Frozen KL reference weights in the compute dtype (None when kl_coef is 0; with
        LoRA the base itself)."""
        self.split = trained(host)
        """What is trained: the whole model, or LoRA adapters on a frozen base."""

    @property
    def base(self):
        """LoRA: the frozen base in the compute dtype (`params` are then the adapters)."""
        return self.split.base

    # -- start ------------------------------------------------------------------------------
    def start(self, log: Callable[[str], None] = print) -> Start:
        """Restore the run's newest checkpoint, or initialise (and warm up) from scratch."""
        tx = make_optimizer(self.host.grpo.optimizer)
        like_params, like_opt = abstract_state(self.host, tx)
        quiet = log if self.primary else (lambda _: None)
        resume, params, opt_state, meta = self.checkpoints.restore_latest(like_params, like_opt,
                                                                          quiet)
        warmed = self.split.warms_base
        self.split.attach(meta, self.checkpoints.directory)
        if resume:
            return self._resume(resume, params, opt_state, meta, log)
        source = (f"model.checkpoint={self.host.model.checkpoint}" if self.host.model.checkpoint
                  else f"random init (run.seed={self.plan.run.seed})")
        sft_loss = self._warm_base(log) if warmed else None
        self.params = self.split.fresh()
        if not warmed:
            sft_loss = self._warm_up(log)
        self.opt_state = init_opt_state(tx, self.params, self.split.shardings)
        if self.plan.algorithm.kl_coef > 0:
            self.reference = self.split.new_reference(self.params, self._save_frozen)
        return Start(0, source, sft_loss)

    def _resume(self, step: int, params, opt_state, meta: dict,
                log: Callable[[str], None]) -> Start:
        """Continue from the restored checkpoint of `step` (a warmed LoRA base is restored
        from <run>/reference, where `_warm_base` saved it, and checked like any base)."""
        check_step_meta(self.plan, step, self.checkpoints.directory / str(step), meta)
        self.split.resumed(meta, self.checkpoints.directory, self._restore_frozen)
        self.params, self.opt_state = params, opt_state
        self.reference = self._restore_reference()
        ignored = self.host.model.checkpoint
        log(f"resumed from the checkpoint of step {step}" + (
            f" (it wins over model.checkpoint={ignored}, which is not read)"
            if ignored else ""))
        return Start(step, f"checkpoint of step {step}", None)

    def _warm_base(self, log: Callable[[str], None]) -> tuple[float, float] | None:
        """LoRA's whole-model warm-up (`warms_base`): the start weights, in the master dtype
        with their own optimizer state, warm up; in the compute dtype they are then the
        frozen base (and KL reference), saved once for a resume. Only the base is kept."""
        self.params = initial_params(self.host)
        sft_loss = self._warm_up(log, self.host.model.param_shardings, frozen=())
        self.split.set_base(cast(self.params, self.host.model.compute_dtype))
        self.params = None
        self._save_frozen(self.base)
        return sft_loss

    def _warm_up(self, log: Callable[[str], None], shardings=None,
                 frozen: tuple | None = None) -> tuple[float, float] | None:
        """`warmup.warm_up` on `self.params`, laid out on `shardings` (default: the trained
        ones), the step's trailing arguments `frozen` (default: the split's)."""
        self.params, sft_loss = warm_up(
            self.host, self.steps.sft, self.params,
            shardings=shardings or self.split.shardings,
            frozen=self.split.frozen if frozen is None else frozen,
            sft_range=self.sft_range, guard=self._guard, log=log)
        return sft_loss

    def _save_frozen(self, weights) -> None:
        """Save the KL reference, or a warmed LoRA base (the reference too), once."""
        with atomic(), Checkpointer(self._reference_dir, keep=1, async_save=False) as ckpt:
            ckpt.save(0, weights, {}, {"kind": "reference", "dtype": self.host.model.compute_dtype})

    def _restore_reference(self):
        if self.plan.algorithm.kl_coef == 0:
            return None
        return self.split.restored_reference(self._restore_frozen)

    def _restore_frozen(self):
        """The weights `_save_frozen` saved (the KL reference, or a warmed LoRA base)."""
        like = abstract_params(self.host.model, self.host.model.compute_dtype)
        with Checkpointer(self._reference_dir, keep=1, async_save=False) as ckpt:
            if ckpt.latest_step() is None:
                raise RuntimeError(f"{self._reference_dir}: no saved KL reference (or warmed "
                                   "LoRA base) to resume with")
            return ckpt.restore(0, like, {})[0]

    # -- steps ------------------------------------------------------------------------------
    def train(self, step: int, rows: dict[str, np.ndarray], save: bool = True
              ) -> dict[str, float]:
        """One GRPO update on this process's rows of `step` (shuffled over its mini-batches);
        with `save`, saves when the cadence says so (else the caller's `save_due`)."""
        rows = shuffled_rows(rows, self.plan.algorithm.optimizer_steps_per_batch,
                             self.plan.run.seed, step, jax.process_index())
        batch = global_batch(self.host, rows, TrainBatch)
        if self.steps.rescore is not None:
            batch = self.steps.rescore(self.params, self.reference, batch, *self.split.frozen)
        self.params, self.opt_state, metrics = self.steps.train(self.params, self.opt_state,
                                                                batch, *self.split.frozen)
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items() if np.ndim(v) == 0}
        self._guard(step + 1, metrics)
        if save:
            self.save_due(step + 1)
        return metrics

    def save_due(self, done: int) -> None:
        """Start a save of the state after `done` RL steps when the cadence says so."""
        if self.saves_after(done):
            self.save(done)

    def _guard(self, done: int, metrics: dict[str, float], phase: str = "step") -> None:
        """Raise `NonFinite` when step `done` (counted from 1) is not finite: the saves already
        started are finished first, so the last good checkpoint is whole; this state is not
        saved. The metrics are replicated, so every process of the group raises here."""
        what = non_finite(metrics)
        if what is None:
            return
        self.checkpoints.wait()
        raise NonFinite(stop_line(done, what, self.checkpoints.latest_step(),
                                  self.checkpoints.directory, phase))

    def saves_after(self, done: int) -> bool:
        """Whether the cadence saves after `done` RL steps: every run.checkpoint_every steps
        and after the last one (checkpoint_every=0: after the last only)."""
        every = self.plan.run.checkpoint_every
        return done == self.plan.run.steps or bool(every and done % every == 0)

    def save(self, done: int) -> None:
        """Start an Orbax save of the state after `done` RL steps (async; `finish` waits)."""
        meta = {"step": done, "seed": self.plan.run.seed, **self._meta, **self.split.meta()}
        self.checkpoints.save(done, self.params, self.opt_state, meta)

    def save_now(self, done: int) -> Path:
        """Save the state after `done` RL steps (unless the cadence just did) and wait until
        it is committed; returns its directory."""
        if not self.saves_after(done):
            self.save(done)
        self.checkpoints.wait()
        return self.checkpoints.directory / str(done)

    # -- weights out ------------------------------------------------------------------------
    def rollout_weights(self):
        """The current weights in the compute dtype, whole on this process's rollout mesh
        (LoRA: merged, base + (alpha / r) A B, before the reshard)."""
        return rollout_params(self.host, self.policy(self.host.model.compute_dtype))

    def policy(self, dtype: str):
        """The policy's plain weights: the master weights, or with LoRA the merged ones in
        `dtype` (a new copy, laid out like the base)."""
        return self.split.policy(self.params, dtype)

    def host_copy(self) -> dict[str, np.ndarray]:
        """Full numpy copy in the compute dtype (collective when shards span processes); with
        LoRA the adapters only ('<weight>/lora_a', '/lora_b': DA's transfer)."""
        return self.split.host_copy(self.params)

    def finish(self, export_dir: Path) -> Path | None:
        """Wait for every save; the primary process exports the final policy to `export_dir`
        (HF safetensors at model.export_dtype, default the compute dtype). Every process calls
        it: the copy is collective where no process holds whole weights. The loop calls it
        inside `stop.final_export` (a signal meanwhile waits for it)."""
        self.checkpoints.wait()  # the last save committed: the export names its step
        step = self.checkpoints.latest_step() or 0
        self.checkpoints.close()
        self.opt_state = None  # the export needs room for one host copy, not the moments
        model = self.plan.model.config
        dtype = str(model.export_dtype or model.dtype)
        policy = self.policy(dtype)
        if not self.primary and locally_whole(policy):
            return None  # the primary copies from its own shards; nothing to join
        flat = host_copy(policy, dtype)
        if not self.primary:
            return None
        staging = export_staging(export_dir)
        export_policy(dataclasses.replace(self.host.model.arch, dtype=dtype), flat,
                      self.host.tokenizer, self.host.sampling, self.host.model.checkpoint, staging)
        self.split.export(self.params, staging)  # LoRA: the adapters too, in PEFT's layout
        return publish_export(staging, export_dir, step)

"""The jitted programs of training on a host's plan, and their inputs as abstract structs.

    make_steps(host) -> Steps         train (GRPO step), sft (warm-up), rescore (pi_old and/or
                                      the reference log-probs), on the plan's shardings; with
                                      LoRA each takes the frozen base as a last argument
    global_batch(host, rows, cls)     this process's rows -> the global TrainBatch / SftBatch
    abstract_state(host, tx)          (params, opt_state) as restore targets (allocate nothing)
    abstract_step_inputs(host, steps) the train step's arguments as structs (`locojax.aot`)

The trainer (`runtime.trainer`) runs them; the TPU compiler compiles them (`aot.programs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np
import optax

from compiler.config import OldLogprobs
from locojax.runtime import assemble
from locojax.runtime.components import Host
from locojax.runtime.trained import abstract_params, trained
from locojax.train import (
    TrainBatch,
    make_optimizer,
    make_rescore_fn,
    make_sft_step,
    make_train_step,
)
from locojax.train.optimizer import opt_state_shardings
from locojax.train.sharding import global_batch as sharded_batch


@dataclass(frozen=True)
class Steps:
    """The jitted programs of training, on the plan's shardings."""

    train: Callable
    """(params, opt_state, TrainBatch) -> (params, opt_state, metrics); donates the state."""
    sft: Callable | None
    """(params, opt_state, SftBatch) -> (params, opt_state, metrics), in the plan's
    `batch.sft_micro_batches`; None without a warm-up."""
    rescore: Callable | None
    """(params, reference, TrainBatch) -> TrainBatch with pi_old recomputed
    (`algorithm.old_forward`) and/or the reference log-probs (kl_coef > 0), in one
    program; None when neither is asked for."""


def make_steps(host: Host) -> Steps:
    """The train, warm-up and rescoring programs of `host`'s plan (with LoRA each takes the
    frozen base as a last argument and trains the adapters only; a whole-model warm-up
    trains the model, `trained.warms_base_of`)."""
    trained_split = trained(host)
    shardings, batch = trained_split.shardings, host.model.batch_sharding
    split = trained_split.step_split()
    sft_shardings, sft_split = (host.model.param_shardings, None) if trained_split.warms_base else (
        shardings, split)
    algorithm = host.plan.algorithm
    # One update per batch: the loss takes pi_old from its own forward (`old_is_current`).
    recompute = algorithm.old_logprobs == OldLogprobs.recompute and algorithm.old_forward
    kl = algorithm.kl_coef > 0
    # Supervised rows (prompt + solution) are scored on the same response columns, at T = 1,
    # in the plan's warm-up micro-batches (sized for its one row per prompt).
    warm = host.plan.batch
    sft_forward = dataclasses.replace(host.grpo.forward,
                                      micro_batches=max(warm.sft_micro_batches, 1),
                                      keep_probs=warm.sft_keep_head_probs)
    return Steps(
        train=make_train_step(host.model.graphdef, host.grpo, param_shardings=shardings,
                              batch_sharding=batch, split=split),
        sft=make_sft_step(host.model.graphdef, assemble.sft_optimizer(algorithm),
                          forward=sft_forward, param_shardings=sft_shardings,
                          batch_sharding=batch, split=sft_split)
        if warm.sft_micro_batches else None,
        rescore=make_rescore_fn(host.model.graphdef, host.grpo, recompute_old=recompute,
                                with_reference=kl, param_shardings=shardings,
                                batch_sharding=batch, split=split) if recompute or kl else None,
    )


def global_batch(host: Host, rows: dict[str, np.ndarray], cls):
    """The global batch (`cls`: TrainBatch or SftBatch) from this process's rows."""
    return cls(**sharded_batch(rows, host.model.batch_sharding))


def abstract_state(host: Host, tx: optax.GradientTransformation):
    """(params, opt_state) as shape/dtype/sharding structs: restore targets that allocate
    nothing, so a resume never holds a second copy of the state. With LoRA the params are
    the adapters."""
    split = trained(host)
    params = split.abstract()
    opt = jax.tree.map(lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                sharding=sharding),
                       jax.eval_shape(tx.init, params),
                       opt_state_shardings(tx, split.shardings))
    return params, opt


def abstract_step_inputs(host: Host, steps: Steps) -> tuple:
    """(params, opt_state, TrainBatch) of `steps.train` as shape/dtype/sharding structs: the
    plan's whole step (`batch.sequences_per_step` rows of `seq_len` tokens, the fields the
    hosts' rows carry, then what `steps.rescore` adds); with LoRA (adapters, their opt_state,
    TrainBatch, base), the frozen base in the compute dtype on the training shardings, as
    `Trainer.train` passes them. Allocates nothing (`locojax.aot` compiles the step for
    devices that hold no data)."""
    params, opt = abstract_state(host, make_optimizer(host.grpo.optimizer))
    frozen = trained(host).abstract_frozen()
    b, algorithm = host.plan.batch, host.plan.algorithm
    rows_BxL = (b.sequences_per_step, b.seq_len)

    def spec(dtype, shape=rows_BxL):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=host.model.batch_sharding)

    batch = TrainBatch(spec(np.int32), spec(np.int32), spec(np.bool_), spec(np.bool_),
                       spec(np.float32, rows_BxL[:1]), spec(np.float32),
                       rollout_logp_BxL=spec(np.float32) if algorithm.rollout_logp else None)
    if steps.rescore is not None:
        # the KL reference: the compute-dtype weights (with LoRA the base itself)
        reference = None if algorithm.kl_coef == 0 else abstract_params(
            host.model, host.model.compute_dtype)
        batch = jax.tree.map(lambda x: spec(x.dtype, x.shape),
                             jax.eval_shape(steps.rescore, params, reference, batch, *frozen))
    return (params, opt, batch, *frozen)

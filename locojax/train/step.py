"""One jitted global train step: mini-batched GRPO (or supervised) updates of the policy.

    batch --split into k mini-batches--> scan over them:
        forward (model hidden states) -> chunked log-probs -> loss -> grads -> AdamW
    -> params, opt_state, metrics (means over the mini-batches)

Mini-batch j takes rows j, j + k, j + 2k, ...: with the batch sharded over its leading axis,
every device keeps its own rows in every mini-batch, so the split moves no data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from locojax.train.batch import SftBatch, TrainBatch
from locojax.train.logprobs import DEFAULT_VOCAB_CHUNK, next_token_logprobs
from locojax.train.loss import grpo_loss, sft_loss
from locojax.train.optimizer import learning_rate_schedule, make_optimizer, opt_state_shardings
from locojax.train.settings import GrpoSettings, OptimizerSettings

Metrics = dict[str, jax.Array]
StepFn = Callable[[nnx.State, Any, Any], tuple[nnx.State, Any, Metrics]]


def policy_logprobs(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    tokens_BxL: jax.Array,
    positions_BxL: jax.Array,
    valid_BxL: jax.Array,
    *,
    vocab_chunk: int = DEFAULT_VOCAB_CHUNK,
) -> tuple[jax.Array, jax.Array]:
    """Token-aligned log-probs and entropies of the model `graphdef` with `params`."""
    model = nnx.merge(graphdef, params)
    hidden_BxLxD, _ = model(tokens_BxL, positions_BxL, kv_valid_BxS=valid_BxL)
    return next_token_logprobs(hidden_BxLxD, model.unembed(), tokens_BxL, vocab_chunk=vocab_chunk)


def _batch_logprobs(graphdef, params, mb: TrainBatch | SftBatch, vocab_chunk: int):
    """`policy_logprobs` of a batch's sequences."""
    return policy_logprobs(
        graphdef, params, mb.tokens_BxL, mb.positions_BxL, mb.valid_BxL, vocab_chunk=vocab_chunk
    )


def split_minibatches(batch, k: int, sharding: NamedSharding | None = None):
    """Stack k mini-batches (rows j, j + k, ...) on a new leading axis."""

    def split(x):
        b = x.shape[0]
        if b % k:
            raise ValueError(f"batch of {b} rows does not split into {k} mini-batches")
        x_kxM = jnp.swapaxes(x.reshape(b // k, k, *x.shape[1:]), 0, 1)
        if sharding is None:
            return x_kxM
        spec = PartitionSpec(None, *sharding.spec)
        return jax.lax.with_sharding_constraint(x_kxM, NamedSharding(sharding.mesh, spec))

    return jax.tree.map(split, batch)


def _learning_rate(schedule, opt_state) -> jax.Array:
    """The rate this update uses: schedule(updates so far), read from the state's counter."""
    counts = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
    return jnp.asarray(schedule(counts[0][1]), jnp.float32)


def _make_step(
    loss_fn: Callable[[nnx.State, Any], tuple[jax.Array, Metrics]],
    optimizer: OptimizerSettings,
    minibatches: int,
    param_shardings: nnx.State | None,
    batch_sharding: NamedSharding | None,
    donate: bool,
) -> StepFn:
    """The jitted step shared by GRPO and SFT: scan of (grad, clip, AdamW) over mini-batches."""
    tx = make_optimizer(optimizer)
    schedule = learning_rate_schedule(optimizer)

    def update(carry, minibatch):
        params, opt_state = carry
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, minibatch)
        metrics = {**metrics, "grad_norm": optax.tree.norm(grads)}
        metrics["lr"] = _learning_rate(schedule, opt_state)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if param_shardings is not None:
            params = jax.lax.with_sharding_constraint(params, param_shardings)
        return (params, opt_state), metrics

    def step(params, opt_state, batch):
        stacked = split_minibatches(batch, minibatches, batch_sharding)
        (params, opt_state), metrics_k = jax.lax.scan(update, (params, opt_state), stacked)
        return params, opt_state, jax.tree.map(lambda m: m.mean(axis=0), metrics_k)

    donate_argnums = (0, 1) if donate else ()
    if param_shardings is None:
        return jax.jit(step, donate_argnums=donate_argnums)
    mesh = jax.tree.leaves(param_shardings)[0].mesh
    rep = NamedSharding(mesh, PartitionSpec())
    opt_sh = opt_state_shardings(tx, param_shardings)
    return jax.jit(
        step,
        in_shardings=(param_shardings, opt_sh, batch_sharding or rep),
        out_shardings=(param_shardings, opt_sh, rep),
        donate_argnums=donate_argnums,
    )


def make_train_step(
    graphdef: nnx.GraphDef,
    settings: GrpoSettings,
    *,
    param_shardings: nnx.State | None = None,
    batch_sharding: NamedSharding | None = None,
    donate: bool = True,
) -> Callable[[nnx.State, Any, TrainBatch], tuple[nnx.State, Any, Metrics]]:
    """step(params, opt_state, batch) -> (params, opt_state, metrics): one GRPO batch."""

    def loss_fn(params, mb: TrainBatch):
        logp_BxL, entropy_BxL = _batch_logprobs(graphdef, params, mb, settings.vocab_chunk)
        return grpo_loss(
            logp_BxL,
            mb.loss_mask_BxL,
            mb.advantages_B,
            mb.behaviour_logp_BxL,
            settings,
            ref_logp_BxL=mb.ref_logp_BxL,
            entropy_BxL=entropy_BxL,
        )

    steps = settings.optimizer_steps_per_batch
    return _make_step(loss_fn, settings.optimizer, steps, param_shardings, batch_sharding, donate)


def make_sft_step(
    graphdef: nnx.GraphDef,
    optimizer: OptimizerSettings,
    *,
    vocab_chunk: int = DEFAULT_VOCAB_CHUNK,
    param_shardings: nnx.State | None = None,
    batch_sharding: NamedSharding | None = None,
    donate: bool = True,
) -> Callable[[nnx.State, Any, SftBatch], tuple[nnx.State, Any, Metrics]]:
    """step(params, opt_state, batch) -> (params, opt_state, metrics): one supervised update."""

    def loss_fn(params, mb: SftBatch):
        logp_BxL, entropy_BxL = _batch_logprobs(graphdef, params, mb, vocab_chunk)
        return sft_loss(logp_BxL, mb.loss_mask_BxL, entropy_BxL=entropy_BxL)

    return _make_step(loss_fn, optimizer, 1, param_shardings, batch_sharding, donate)


def make_logprob_fn(
    graphdef: nnx.GraphDef,
    *,
    vocab_chunk: int = DEFAULT_VOCAB_CHUNK,
    param_shardings: nnx.State | None = None,
    batch_sharding: NamedSharding | None = None,
) -> Callable[[nnx.State, jax.Array, jax.Array, jax.Array], jax.Array]:
    """Jitted logp(params, tokens_BxL, positions_BxL, valid_BxL) -> logp_BxL (reference model)."""

    def logp(params, tokens_BxL, positions_BxL, valid_BxL):
        return policy_logprobs(
            graphdef, params, tokens_BxL, positions_BxL, valid_BxL, vocab_chunk=vocab_chunk
        )[0]

    if param_shardings is None:
        return jax.jit(logp)
    return jax.jit(
        logp,
        in_shardings=(param_shardings, batch_sharding, batch_sharding, batch_sharding),
        out_shardings=batch_sharding,
    )

"""One jitted global train step: mini-batched GRPO (or supervised) updates of the policy.

    batch --split into k mini-batches--> scan over them (one optimizer update each):
        loss weights of the whole mini-batch (token / sequence counts, the constant)
        --split into m micro-batches--> scan: forward (remat blocks) -> response-column
            log-probs -> loss -> grads, summed over the micro-batches
        -> clip, AdamW
    -> params, opt_state, metrics (means over the mini-batches; `params_finite`: whether
       every updated parameter is finite, for the NaN guard)

Mini-batch j takes rows j, j + k, j + 2k, ... and micro-batch i of it rows i, i + m, ...:
with the batch sharded over its leading axis, every device keeps its own rows in every
mini- and micro-batch, so the splits move no data. Only the last `forward.response_len`
columns of a row are scored (see the package docstring); the old / reference forwards
(`make_logprob_fn`, `make_rescore_fn`) run on the same micro-batch rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from compiler.vocab import LossAggregation, Remat
from locojax.train.attention import forward_ops
from locojax.train.batch import SftBatch, TrainBatch
from locojax.train.logprobs import next_token_logprobs
from locojax.train.loss import METRICS_MAX, LossWeights, grpo_loss, loss_weights, sft_loss
from locojax.train.optimizer import learning_rate_schedule, make_optimizer, opt_state_shardings
from locojax.train.settings import ForwardSettings, GrpoSettings, OptimizerSettings

DEFAULT_FORWARD = ForwardSettings()
Metrics = dict[str, jax.Array]
StepFn = Callable[[nnx.State, Any, Any], tuple[nnx.State, Any, Metrics]]


def scored_columns(length: int, forward: ForwardSettings) -> int:
    """Columns of an L-token row the trainer scores: the last `response_len` (0: L - 1)."""
    if forward.response_len >= length:
        raise ValueError(f"response_len={forward.response_len} needs rows longer than {length}")
    return forward.response_len or length - 1


def score_tokens(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    tokens_BxL: jax.Array,
    positions_BxL: jax.Array,
    valid_BxL: jax.Array,
    forward: ForwardSettings = DEFAULT_FORWARD,
) -> tuple[jax.Array, jax.Array]:
    """log-probs and entropies BxT of the scored columns (the last T = `scored_columns`).

    Column j is token L - T + j under softmax(logits / forward.temperature); the output head
    runs only on hidden states [L - T - 1, L - 1).
    """
    chex.assert_rank(tokens_BxL, 2)
    chex.assert_equal_shape([tokens_BxL, positions_BxL, valid_BxL])
    chex.assert_type([tokens_BxL, positions_BxL], int)
    model = nnx.merge(graphdef, params)
    hidden_BxLxD, _ = model(tokens_BxL, positions_BxL, kv_valid_BxS=valid_BxL,
                            remat=forward.remat == Remat.block,
                            activations=forward.activation_sharding, ops=forward_ops(forward))
    t = scored_columns(tokens_BxL.shape[1], forward)
    return next_token_logprobs(hidden_BxLxD, model.unembed(), tokens_BxL,
                               vocab_chunk=forward.vocab_chunk,
                               temperature=forward.temperature, response_len=t,
                               keep_probs=forward.keep_probs,
                               activations=forward.activation_sharding)


def policy_logprobs(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    tokens_BxL: jax.Array,
    positions_BxL: jax.Array,
    valid_BxL: jax.Array,
    forward: ForwardSettings = DEFAULT_FORWARD,
) -> tuple[jax.Array, jax.Array]:
    """`score_tokens` aligned to tokens (BxL, 0 on the columns not scored)."""
    logp_BxT, entropy_BxT = score_tokens(graphdef, params, tokens_BxL, positions_BxL,
                                         valid_BxL, forward)
    pad = ((0, 0), (tokens_BxL.shape[1] - logp_BxT.shape[1], 0))
    return jnp.pad(logp_BxT, pad), jnp.pad(entropy_BxT, pad)


def rows_sharded(forward: ForwardSettings, batch_sharding: NamedSharding | None
                 ) -> ForwardSettings:
    """`forward` with its activations held to the batch's row sharding (B x L x D: rows as
    the batch, the rest replicated); unchanged without a batch sharding."""
    if batch_sharding is None:
        return forward
    rows = NamedSharding(batch_sharding.mesh, PartitionSpec(batch_sharding.spec[0], None, None))
    return dataclasses.replace(forward, activation_sharding=rows)


def _columns(x_BxL: jax.Array | None, t: int) -> jax.Array | None:
    return None if x_BxL is None else x_BxL[:, x_BxL.shape[1] - t :]


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


def merge_minibatches(stacked, sharding: NamedSharding | None = None):
    """Inverse of `split_minibatches`: k x M stacked rows back to the batch's row order."""

    def merge(x_kxM):
        k, m = x_kxM.shape[:2]
        x = jnp.swapaxes(x_kxM, 0, 1).reshape(k * m, *x_kxM.shape[2:])
        return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)

    return jax.tree.map(merge, stacked)


def _learning_rate(schedule, opt_state) -> jax.Array:
    """The rate this update uses: schedule(updates so far), read from the state's counter."""
    counts = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
    return jnp.asarray(schedule(counts[0][1]), jnp.float32)


def _combine(total: Metrics, part: Metrics) -> Metrics:
    """Metrics of two micro-batches of one mini-batch: partial sums add, maxima max."""
    return {k: jnp.maximum(total[k], part[k]) if k in METRICS_MAX else total[k] + part[k]
            for k in total}


LossFn = Callable[[nnx.State, Any, LossWeights], tuple[jax.Array, Metrics]]
PARAMS_FINITE = "params_finite"
"""Metric: 1.0 when every updated parameter is finite, else 0.0 (the NaN guard reads it)."""


def params_finite(params: nnx.State) -> jax.Array:
    """1.0 when every floating leaf of `params` is finite, else 0.0: one fused reduction per
    leaf on the devices that hold it, combined into one replicated scalar inside the step, so
    the guard costs no extra program or host sync."""
    oks = [jnp.isfinite(x).all() for x in jax.tree.leaves(params)
           if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.stack(oks).all().astype(jnp.float32) if oks else jnp.float32(1.0)


def accumulate_grads(
    loss_fn: LossFn,
    params: nnx.State,
    minibatch: Any,
    weights: LossWeights,
    micro_batches: int,
    *,
    batch_sharding: NamedSharding | None = None,
    param_shardings: nnx.State | None = None,
) -> tuple[nnx.State, Metrics]:
    """Gradient and metrics of `loss_fn` over a mini-batch, in `micro_batches` chunks of rows.

    `weights` are the whole mini-batch's loss weights, so the summed micro-batch gradients
    are the mini-batch's gradient (up to rounding) whatever the chunk count.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if micro_batches == 1:
        (_, metrics), grads = grad_fn(params, minibatch, weights)
        return grads, metrics
    chunks = split_minibatches((minibatch, weights), micro_batches, batch_sharding)
    first = jax.tree.map(lambda x: x[0], chunks)
    _, metric_shapes = jax.eval_shape(grad_fn, params, *first)[0]

    def body(carry, chunk):
        grads, metrics = carry
        (_, part), g = grad_fn(params, *chunk)
        grads = jax.tree.map(jnp.add, grads, g)
        if param_shardings is not None:
            grads = jax.lax.with_sharding_constraint(grads, param_shardings)
        return (grads, _combine(metrics, part)), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    if param_shardings is not None:
        zeros = jax.lax.with_sharding_constraint(zeros, param_shardings)
    metrics0 = {k: jnp.zeros(v.shape, v.dtype) for k, v in metric_shapes.items()}
    (grads, metrics), _ = jax.lax.scan(body, (zeros, metrics0), chunks)
    return grads, metrics


Combine = Callable[[Any, Any], nnx.State]
"""combine(frozen, trainable) -> the params the model runs with (LoRA: the frozen base with
its adapters, `locojax.train.lora`); without one the trainable params are the model's."""


@dataclasses.dataclass(frozen=True)
class ParamSplit:
    """Trained and frozen parameters: the step updates only the trainable tree; the frozen
    one is an extra argument (never donated, never in the optimizer)."""

    combine: Combine
    """(frozen, trainable) -> model params."""
    frozen_shardings: Any = None
    """Shardings of the frozen tree (None: unsharded jit)."""


def _model_params(split: ParamSplit | None, params, frozen):
    return params if split is None else split.combine(frozen, params)


def _make_step(
    loss_fn: LossFn,
    weights_fn: Callable[[Any], LossWeights],
    optimizer: OptimizerSettings,
    minibatches: int,
    micro_batches: int,
    param_shardings: nnx.State | None,
    batch_sharding: NamedSharding | None,
    donate: bool,
    split: ParamSplit | None = None,
) -> StepFn:
    """The jitted step shared by GRPO and SFT: scan of (accumulated grad, clip, AdamW).

    With a `split`, step(params, opt_state, batch, frozen): `params` (trained, in the
    optimizer) are combined with `frozen` inside the loss, so gradients reach only them."""
    tx = make_optimizer(optimizer)
    schedule = learning_rate_schedule(optimizer)

    def update(frozen, carry, minibatch):
        params, opt_state = carry

        def trained_loss(p, mb, weights):
            return loss_fn(_model_params(split, p, frozen), mb, weights)

        grads, metrics = accumulate_grads(
            trained_loss, params, minibatch, weights_fn(minibatch), micro_batches,
            batch_sharding=batch_sharding, param_shardings=param_shardings)
        metrics = {**metrics, "grad_norm": optax.tree.norm(grads)}
        metrics["lr"] = _learning_rate(schedule, opt_state)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if param_shardings is not None:
            params = jax.lax.with_sharding_constraint(params, param_shardings)
        return (params, opt_state), metrics

    def step(params, opt_state, batch, frozen=None):
        stacked = split_minibatches(batch, minibatches, batch_sharding)
        (params, opt_state), metrics_k = jax.lax.scan(partial(update, frozen),
                                                      (params, opt_state), stacked)
        metrics = {k: m.max(axis=0) if k in METRICS_MAX else m.mean(axis=0)
                   for k, m in metrics_k.items()}
        metrics[PARAMS_FINITE] = params_finite(params)
        return params, opt_state, metrics

    donate_argnums = (0, 1) if donate else ()
    if param_shardings is None:
        return jax.jit(step, donate_argnums=donate_argnums)
    mesh = jax.tree.leaves(param_shardings)[0].mesh
    rep = NamedSharding(mesh, PartitionSpec())
    opt_sh = opt_state_shardings(tx, param_shardings)
    frozen_sh = () if split is None else (split.frozen_shardings,)
    return jax.jit(
        step,
        in_shardings=(param_shardings, opt_sh, batch_sharding or rep, *frozen_sh),
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
    split: ParamSplit | None = None,
) -> Callable[[nnx.State, Any, TrainBatch], tuple[nnx.State, Any, Metrics]]:
    """step(params, opt_state, batch) -> (params, opt_state, metrics): one GRPO batch
    (with a `split`: step(trainable, opt_state, batch, frozen), see `_make_step`).

    `settings.optimizer_steps_per_batch` mini-batches, each of `settings.forward.micro_batches`
    gradient-accumulation chunks; batch rows must divide into their product.
    """
    fwd = rows_sharded(settings.forward, batch_sharding)

    def weights_fn(mb: TrainBatch) -> LossWeights:
        t = scored_columns(mb.tokens_BxL.shape[1], fwd)
        return loss_weights(_columns(mb.loss_mask_BxL, t), settings.aggregation,
                            settings.max_response_len)

    # The loss runs with the row-sharded forward (a merge had passed `settings` unsharded,
    # so the blocks and the head lost their layout on the TPU: docs/aot.md).
    loss_fn = grpo_loss_fn(graphdef, dataclasses.replace(settings, forward=fwd))
    return _make_step(loss_fn, weights_fn, settings.optimizer,
                      settings.optimizer_steps_per_batch, fwd.micro_batches, param_shardings,
                      batch_sharding, donate, split)


def grpo_loss_fn(graphdef: nnx.GraphDef, settings: GrpoSettings) -> LossFn:
    """loss_fn(params, mini- or micro-batch, weights) -> (loss, metrics) of the GRPO step.

    `settings.old_is_current`: pi_old is stop_gradient(the log-probs being trained) and the
    batch's own log-probs are the sampler's (`rollout_logp_BxL`, else `behaviour_logp_BxL`):
    what the recomputed path holds after `make_rescore_fn`, without its forward.
    """
    fwd = settings.forward

    def loss_fn(params, mb: TrainBatch, weights: LossWeights):
        logp_BxT, entropy_BxT = score_tokens(graphdef, params, mb.tokens_BxL, mb.positions_BxL,
                                             mb.valid_BxL, fwd)
        t = logp_BxT.shape[1]
        old_BxT, rollout_BxL = _columns(mb.behaviour_logp_BxL, t), mb.rollout_logp_BxL
        if settings.old_is_current:
            old_BxT = jax.lax.stop_gradient(logp_BxT)
            rollout_BxL = mb.behaviour_logp_BxL if rollout_BxL is None else rollout_BxL
        return grpo_loss(
            logp_BxT,
            _columns(mb.loss_mask_BxL, t),
            mb.advantages_B,
            old_BxT,
            settings,
            ref_logp_BxL=_columns(mb.ref_logp_BxL, t),
            entropy_BxL=entropy_BxT,
            rollout_logp_BxL=_columns(rollout_BxL, t),
            weights=weights,
        )

    return loss_fn


def make_sft_step(
    graphdef: nnx.GraphDef,
    optimizer: OptimizerSettings,
    *,
    forward: ForwardSettings = DEFAULT_FORWARD,
    param_shardings: nnx.State | None = None,
    batch_sharding: NamedSharding | None = None,
    donate: bool = True,
    split: ParamSplit | None = None,
) -> Callable[[nnx.State, Any, SftBatch], tuple[nnx.State, Any, Metrics]]:
    """step(params, opt_state, batch) -> (params, opt_state, metrics): one supervised update
    (token-mean cross-entropy at temperature 1, in `forward.micro_batches` chunks)."""
    fwd = dataclasses.replace(rows_sharded(forward, batch_sharding), temperature=1.0)

    def weights_fn(mb: SftBatch) -> LossWeights:
        t = scored_columns(mb.tokens_BxL.shape[1], fwd)
        return loss_weights(_columns(mb.loss_mask_BxL, t), LossAggregation.token_mean)

    def loss_fn(params, mb: SftBatch, weights: LossWeights):
        logp_BxT, entropy_BxT = score_tokens(graphdef, params, mb.tokens_BxL, mb.positions_BxL,
                                             mb.valid_BxL, fwd)
        mask_BxT = _columns(mb.loss_mask_BxL, logp_BxT.shape[1])
        return sft_loss(logp_BxT, mask_BxT, entropy_BxL=entropy_BxT, weights=weights)

    return _make_step(loss_fn, weights_fn, optimizer, 1, fwd.micro_batches, param_shardings,
                      batch_sharding, donate, split)


def _by_chunks(fn, chunks: int, batch_sharding: NamedSharding | None):
    """fn(rows...) -> BxL outputs, applied to `chunks` interleaved chunks of rows in turn."""

    def chunked(*rows):
        stacked = split_minibatches(rows, chunks, batch_sharding)
        return merge_minibatches(jax.lax.map(lambda x: fn(*x), stacked), batch_sharding)

    return chunked


def make_logprob_fn(
    graphdef: nnx.GraphDef,
    *,
    forward: ForwardSettings = DEFAULT_FORWARD,
    chunks: int = 1,
    param_shardings: nnx.State | None = None,
    batch_sharding: NamedSharding | None = None,
) -> Callable[[nnx.State, jax.Array, jax.Array, jax.Array], jax.Array]:
    """Jitted logp(params, tokens_BxL, positions_BxL, valid_BxL) -> logp_BxL (0 where not
    scored), the rows taken `chunks` at a time (pass mini-batches x micro-batches to score
    exactly a train micro-batch's rows per forward)."""
    forward = rows_sharded(forward, batch_sharding)

    def logp(params, tokens_BxL, positions_BxL, valid_BxL):
        def one(*rows):
            return policy_logprobs(graphdef, params, *rows, forward)[0]

        return _by_chunks(one, chunks, batch_sharding)(tokens_BxL, positions_BxL, valid_BxL)

    if param_shardings is None:
        return jax.jit(logp)
    return jax.jit(
        logp,
        in_shardings=(param_shardings, batch_sharding, batch_sharding, batch_sharding),
        out_shardings=batch_sharding,
    )


def make_rescore_fn(
    graphdef: nnx.GraphDef,
    settings: GrpoSettings,
    *,
    recompute_old: bool,
    with_reference: bool,
    param_shardings: nnx.State | None = None,
    batch_sharding: NamedSharding | None = None,
    split: ParamSplit | None = None,
) -> Callable[[nnx.State, nnx.State | None, TrainBatch], TrainBatch]:
    """Jitted rescore(params, reference, batch) -> batch with the trainer's log-probs (with a
    `split`: rescore(trainable, reference, batch, frozen), the reference sharded as frozen).

    `recompute_old` (`algorithm.old_forward`: recompute with several updates per batch;
    with one, `GrpoSettings.old_is_current` gives the same without this forward):
    `behaviour_logp_BxL` becomes the trainer's own log-probs under `params` (pi_old, before
    the batch's first update), and
    `rollout_logp_BxL` keeps the engine's sampling log-probs (the batch's behaviour ones when
    it has none) for the truncated importance weight. `with_reference`: `reference` (else
    None) fills `ref_logp_BxL`. One program per batch over the train step's micro-batch rows
    (mini-batches x micro-batches chunks), both forwards on each chunk in turn.
    """
    chunks = settings.optimizer_steps_per_batch * settings.forward.micro_batches
    fwd = rows_sharded(settings.forward, batch_sharding)

    def rescore(params, reference, batch: TrainBatch, frozen=None) -> TrainBatch:
        params = _model_params(split, params, frozen)

        def one(*rows):
            old = policy_logprobs(graphdef, params, *rows, fwd)[0] if recompute_old else None
            ref = policy_logprobs(graphdef, reference, *rows, fwd)[0] if with_reference else None
            return old, ref

        old, ref = _by_chunks(one, chunks, batch_sharding)(
            batch.tokens_BxL, batch.positions_BxL, batch.valid_BxL)
        out = batch
        if recompute_old:
            rollout = batch.behaviour_logp_BxL if batch.rollout_logp_BxL is None else (
                batch.rollout_logp_BxL)
            out = dataclasses.replace(out, behaviour_logp_BxL=old, rollout_logp_BxL=rollout)
        if with_reference:
            out = dataclasses.replace(out, ref_logp_BxL=ref)
        return out

    if param_shardings is None:
        return jax.jit(rescore)
    ref_sh = param_shardings if with_reference else batch_sharding
    frozen_sh = () if split is None else (split.frozen_shardings,)
    if split is not None and with_reference:
        ref_sh = split.frozen_shardings  # the reference is the frozen base
    return jax.jit(rescore, in_shardings=(param_shardings, ref_sh, batch_sharding, *frozen_sh),
                   out_shardings=batch_sharding)

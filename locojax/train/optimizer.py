"""AdamW with linear warm-up then constant or cosine learning rate, and global-norm clipping."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from compiler.vocab import LrSchedule
from locojax.train.settings import OptimizerSettings


def learning_rate_schedule(settings: OptimizerSettings) -> optax.Schedule:
    """Learning rate of update number `count` (from 0): warm-up, then constant or cosine."""
    peak, warmup = settings.learning_rate, settings.warmup_steps
    if settings.schedule == LrSchedule.constant:
        after = optax.constant_schedule(peak)
    elif settings.schedule == LrSchedule.cosine:
        decay_steps = max(settings.total_steps - warmup, 1)
        after = optax.cosine_decay_schedule(peak, decay_steps, alpha=settings.min_lr_ratio)
    else:
        raise ValueError(f"unknown learning-rate schedule {settings.schedule!r}")
    if warmup <= 0:
        return after

    def schedule(count):
        # Warm-up update i uses peak * (i + 1) / warmup: no update is wasted at rate 0.
        ramp = peak * (count + 1) / warmup
        return jnp.where(count < warmup, ramp, after(jnp.maximum(count - warmup, 0)))

    return schedule


def _decay_mask(params):
    """True for matrices, False for norm scales (stacked scales are 2-D, so go by name)."""

    def decays(path, _leaf) -> bool:
        return not any("norm" in str(getattr(key, "key", key)) for key in path)

    return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(settings: OptimizerSettings) -> optax.GradientTransformation:
    """Clip by global norm (when on), then AdamW on the schedule."""
    adamw = optax.adamw(
        learning_rate_schedule(settings),
        b1=settings.b1,
        b2=settings.b2,
        eps=settings.eps,
        weight_decay=settings.weight_decay,
        mask=_decay_mask,
    )
    if settings.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(settings.grad_clip), adamw)
    return adamw


def opt_state_shardings(tx: optax.GradientTransformation, param_shardings):
    """Shardings of `tx`'s state: moments like their parameters, counters replicated."""
    mesh = jax.tree.leaves(param_shardings)[0].mesh
    replicated = NamedSharding(mesh, PartitionSpec())
    # The state's layout depends only on the parameter tree, so scalars stand in for shapes.
    placeholders = jax.tree.map(lambda _: jax.ShapeDtypeStruct((), "float32"), param_shardings)
    abstract_state = jax.eval_shape(tx.init, placeholders)
    return optax.tree_map_params(
        tx,
        lambda _leaf, sharding: sharding,
        abstract_state,
        param_shardings,
        transform_non_params=lambda _leaf: replicated,
    )


def init_opt_state(tx: optax.GradientTransformation, params, param_shardings=None):
    """Optimizer state for `params`, laid out like them when shardings are given."""
    if param_shardings is None:
        return jax.jit(tx.init)(params)
    return jax.jit(tx.init, out_shardings=opt_state_shardings(tx, param_shardings))(params)

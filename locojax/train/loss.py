"""The GRPO objective on token log-probs: a policy loss of the table, k3 KL, aggregation.

    log pi, log pi_old --log_ratio--> r --POLICY_LOSSES[loss]--> surrogate (to maximise)
    surrogate x rollout weight (+ kl_coef x k3 KL) --loss_weights--> loss, token-mean metrics

Every tensor is aligned to the token it scores (index l holds log p(tokens[l] | tokens[:l]));
`mask_BxL` marks response tokens, the only ones with loss and gradient.

Micro-batches: the normalisers (token count, sequence count, constant) belong to the whole
mini-batch, so `loss_weights` is computed once on the mini-batch's mask and its rows are
handed to each micro-batch's `grpo_loss` / `sft_loss`. Then the micro-batch losses and every
metric but `ratio_max` (a max: `METRICS_MAX`) add up to the mini-batch's exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import chex
import jax
import jax.numpy as jnp

from compiler.vocab import LossAggregation, PolicyLoss, RatioLevel
from locojax.train.correction import rollout_weight
from locojax.train.settings import (
    KL_LOG_RATIO_BOUND,
    KL_TERM_MAX,
    LOG_RATIO_BOUND,
    GrpoSettings,
)

METRICS_MAX = frozenset({"ratio_max", "logp_mismatch_max"})
"""Metrics that combine over micro-batches by max; every other metric is a partial sum."""


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LossWeights:
    """Per-token weights of one mini-batch's rows, zero off the mask."""

    loss_BxL: jax.Array
    """loss = sum(loss_BxL * token_loss_BxL): the aggregation's normalisers."""
    token_BxL: jax.Array
    """1 / (response tokens of the mini-batch): sum(token_BxL * x) is x's token mean."""


def aggregation_weights(
    mask_BxL: jax.Array, aggregation: LossAggregation, max_response_len: int = 1
) -> jax.Array:
    """Per-token weights w with loss = sum(w * token_loss); zero off the mask.

    Rows without response tokens (batch padding) count as no sequence at all.
    """
    m_BxL = mask_BxL.astype(jnp.float32)
    tokens_B = m_BxL.sum(axis=1)
    sequences = jnp.maximum((tokens_B > 0).sum(), 1).astype(jnp.float32)
    if aggregation == LossAggregation.token_mean:
        return m_BxL / jnp.maximum(tokens_B.sum(), 1.0)
    if aggregation == LossAggregation.sequence_mean:
        return m_BxL / jnp.maximum(tokens_B, 1.0)[:, None] / sequences
    if aggregation == LossAggregation.constant:
        return m_BxL / (max_response_len * sequences)
    raise ValueError(f"unknown loss aggregation {aggregation!r}")


def loss_weights(
    mask_BxL: jax.Array, aggregation: LossAggregation, max_response_len: int = 1
) -> LossWeights:
    """The aggregation's and the token-mean weights of a whole mini-batch's mask."""
    mask_BxL = mask_BxL.astype(bool)
    return LossWeights(
        aggregation_weights(mask_BxL, aggregation, max_response_len),
        aggregation_weights(mask_BxL, LossAggregation.token_mean),
    )


def k3_kl(logp_BxL: jax.Array, ref_logp_BxL: jax.Array, mask_BxL: jax.Array) -> jax.Array:
    """Schulman's k3 estimate of KL(policy || reference) per token, clamped; 0 off the mask.

    d = log pi_ref - log pi is clamped to [-KL_LOG_RATIO_BOUND, KL_LOG_RATIO_BOUND] (= +-20,
    so exp never overflows) and exp(d) - d - 1 to [0, KL_TERM_MAX] (= 10, verl's bound): a
    token the policy pushed far below the reference adds at most 10 and no gradient, instead
    of a term that dominates the step until the global norm clip hides it.
    """
    # Masking before exp keeps off-mask garbage (e.g. -inf) from turning gradients into NaN.
    delta_BxL = jnp.where(mask_BxL, ref_logp_BxL - logp_BxL, 0.0)
    delta_BxL = jnp.clip(delta_BxL, -KL_LOG_RATIO_BOUND, KL_LOG_RATIO_BOUND)
    return jnp.minimum(jnp.exp(delta_BxL) - delta_BxL - 1.0, KL_TERM_MAX)


def _check_columns(logp_BxL: jax.Array, mask_BxL: jax.Array, *more: jax.Array | None) -> None:
    """The loss inputs are BxL like the log-probs, which are floats (chex; at trace time)."""
    chex.assert_rank(logp_BxL, 2)
    chex.assert_type(logp_BxL, float)
    chex.assert_equal_shape([logp_BxL, mask_BxL, *(x for x in more if x is not None)])


def log_ratio(logp_BxL: jax.Array, old_logp_BxL: jax.Array, mask_BxL: jax.Array,
              level: RatioLevel) -> jax.Array:
    """log(pi / pi_old) per token, clamped to +-LOG_RATIO_BOUND before any exp (verl's bound);
    0 off the mask.

    token: log pi(y_t) - log pi_old(y_t). sequence (GSPO, in its gspo-token form): the row's
    mean over its response tokens, as a constant, plus log pi(y_t) - sg[log pi(y_t)]: the
    value is the sequence's length-normalised log-ratio, the gradient that of log pi(y_t), so
    exp of it is s_i = (pi(y_i) / pi_old(y_i))^(1 / |y_i|) on every token of row i.
    """
    logp_BxL = jnp.where(mask_BxL, logp_BxL, 0.0)
    diff_BxL = jnp.where(mask_BxL, logp_BxL - old_logp_BxL, 0.0)
    if level == RatioLevel.token:
        return jnp.clip(diff_BxL, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    tokens_B = jnp.maximum(mask_BxL.sum(axis=1), 1).astype(jnp.float32)
    seq_B = jnp.clip(diff_BxL.sum(axis=1) / tokens_B, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    live_BxL = logp_BxL - jax.lax.stop_gradient(logp_BxL)
    return jnp.where(mask_BxL, jax.lax.stop_gradient(seq_B)[:, None] + live_BxL, 0.0)


@dataclass(frozen=True)
class Surrogate:
    """One policy loss's per-token objective on a batch (zero weight off the mask is applied
    by the caller)."""

    objective_BxL: jax.Array
    """What the step maximises per token; its gradient is the policy gradient."""
    clipped_BxL: jax.Array
    """Tokens whose ratio the loss clipped (`clip_frac`)."""
    metrics: dict[str, jax.Array]
    """The loss's own per-token metrics (token means in the row)."""


PolicyLossFn = Callable[[jax.Array, jax.Array, jax.Array, GrpoSettings], Surrogate]
"""(ratio_BxL, adv_Bx1, live_BxL, settings) -> Surrogate. `live_BxL` is 0 in value and
carries the gradient of log pi (0 off the mask); the ratio carries it too."""


def ppo_clip(ratio_BxL: jax.Array, adv_Bx1: jax.Array, live_BxL: jax.Array,
             settings: GrpoSettings) -> Surrogate:
    """PPO's clipped surrogate min(r A, clip(r, 1 - eps, 1 + eps_high) A) (Schulman et al.
    2017; GRPO, DAPO, GSPO), floored at c A where A < 0 with `settings.dual_clip` c > 0 (Ye et
    al. 2020, verl's `clip_ratio_c`). A clipped token has no gradient."""
    low, high = 1.0 - settings.clip_eps, 1.0 + settings.clip_eps_high
    objective_BxL = jnp.minimum(ratio_BxL * adv_Bx1, jnp.clip(ratio_BxL, low, high) * adv_Bx1)
    metrics = {}
    if settings.dual_clip > 0:
        floor_Bx1 = settings.dual_clip * adv_Bx1
        dual_BxL = (adv_Bx1 < 0) & (objective_BxL < floor_Bx1)
        objective_BxL = jnp.where(dual_BxL, floor_Bx1, objective_BxL)
        metrics["dual_clip_frac"] = dual_BxL.astype(jnp.float32)
    clipped_BxL = ((adv_Bx1 > 0) & (ratio_BxL > high)) | ((adv_Bx1 < 0) & (ratio_BxL < low))
    return Surrogate(objective_BxL, clipped_BxL, metrics)


def cispo(ratio_BxL: jax.Array, adv_Bx1: jax.Array, live_BxL: jax.Array,
          settings: GrpoSettings) -> Surrogate:
    """CISPO (Chen et al. 2025, MiniMax-M1, arXiv:2506.13585, eq. 4): sg[clip(r, 1 - eps,
    1 + eps_high)] A log pi. Its value here is the clipped ratio times A (the log pi term
    enters as `live_BxL`, 0 in value), its gradient sg[clip(r)] A grad log pi on every
    token: a clipped token keeps its gradient at the clipped weight."""
    low, high = 1.0 - settings.clip_eps, 1.0 + settings.clip_eps_high
    weight_BxL = jax.lax.stop_gradient(jnp.clip(ratio_BxL, low, high))
    clipped_BxL = (ratio_BxL > high) | (ratio_BxL < low)
    return Surrogate(weight_BxL * adv_Bx1 * (1.0 + live_BxL), clipped_BxL, {})


POLICY_LOSSES: dict[PolicyLoss, PolicyLossFn] = {
    PolicyLoss.ppo_clip: ppo_clip,
    PolicyLoss.cispo: cispo,
}
"""`algorithm.loss` -> its function; a new loss is one function here and one `PolicyLoss`
value (CONTRIBUTING.md)."""


def grpo_loss(
    logp_BxL: jax.Array,
    mask_BxL: jax.Array,
    advantages_B: jax.Array,
    behaviour_logp_BxL: jax.Array,
    settings: GrpoSettings,
    *,
    ref_logp_BxL: jax.Array | None = None,
    entropy_BxL: jax.Array | None = None,
    rollout_logp_BxL: jax.Array | None = None,
    weights: LossWeights | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The policy loss (+ kl_coef * k3 KL) and its metrics (token means over the mask).

    The surrogate per token is `POLICY_LOSSES[settings.loss]` of r = pi / pi_old
    (`behaviour_logp_BxL` is log pi_old; `log_ratio` per token or per sequence) and the
    row's advantage A; with `rollout_logp_BxL` it is multiplied by
    `settings.rollout_correction`'s weight of pi_old / pi_rollout
    (`correction.rollout_weight`), no gradient through the weight (decoupled PPO when pi_old
    is the trainer's proximal policy).
    `weights`: the whole mini-batch's `loss_weights` rows when this is one micro-batch of it
    (None: this batch's).
    """
    _check_columns(logp_BxL, mask_BxL, behaviour_logp_BxL, ref_logp_BxL, entropy_BxL,
                   rollout_logp_BxL)
    chex.assert_shape(advantages_B, logp_BxL.shape[:1])
    chex.assert_type([behaviour_logp_BxL, advantages_B], float)
    if settings.kl_coef > 0 and ref_logp_BxL is None:
        raise ValueError(f"kl_coef={settings.kl_coef} > 0 needs reference log-probs")
    mask_BxL = mask_BxL.astype(bool)
    if weights is None:
        weights = loss_weights(mask_BxL, settings.aggregation, settings.max_response_len)
    adv_Bx1 = advantages_B.astype(jnp.float32)[:, None]
    ratio_BxL = jnp.exp(log_ratio(logp_BxL, behaviour_logp_BxL, mask_BxL, settings.ratio_level))
    live_BxL = jnp.where(mask_BxL, logp_BxL - jax.lax.stop_gradient(logp_BxL), 0.0)
    policy = POLICY_LOSSES[settings.loss](ratio_BxL, adv_Bx1, live_BxL, settings)
    surrogate_BxL = policy.objective_BxL
    rc_BxL, metrics = rollout_weight(behaviour_logp_BxL, rollout_logp_BxL, mask_BxL,
                                     *settings.correction)
    metrics.update(policy.metrics)
    token_loss_BxL = -surrogate_BxL if rc_BxL is None else -rc_BxL * surrogate_BxL
    if ref_logp_BxL is not None:
        kl_BxL = k3_kl(logp_BxL, ref_logp_BxL, mask_BxL)
        if settings.kl_coef > 0:
            token_loss_BxL = token_loss_BxL + settings.kl_coef * kl_BxL
        metrics["kl"] = kl_BxL
    loss = (weights.loss_BxL * token_loss_BxL).sum()
    metrics.update({
        "pg_loss": -surrogate_BxL,
        "clip_frac": policy.clipped_BxL.astype(jnp.float32),
        "ratio_mean": ratio_BxL,
        "advantage_mean": jnp.broadcast_to(adv_Bx1, mask_BxL.shape),
    })
    if entropy_BxL is not None:
        metrics["entropy"] = entropy_BxL
    return loss, _reduce(metrics, weights, mask_BxL, loss, ratio_BxL)


def _reduce(metrics: dict[str, jax.Array], weights: LossWeights, mask_BxL: jax.Array,
            loss: jax.Array, ratio_BxL: jax.Array) -> dict[str, jax.Array]:
    """Per-token metrics to token means over the mask; the maxima; loss and token count."""
    out = {k: (weights.token_BxL * jax.lax.stop_gradient(v)).sum() for k, v in metrics.items()}
    out["loss"] = jax.lax.stop_gradient(loss)
    maxima = {"ratio_max": ratio_BxL, "logp_mismatch_max": metrics.get("logp_mismatch_mean")}
    for name, x_BxL in maxima.items():
        if x_BxL is not None:
            out[name] = jnp.max(jnp.where(mask_BxL, jax.lax.stop_gradient(x_BxL), 0.0))
    out["response_tokens"] = mask_BxL.sum().astype(jnp.float32)
    return out


def sft_loss(
    logp_BxL: jax.Array,
    mask_BxL: jax.Array,
    *,
    entropy_BxL: jax.Array | None = None,
    weights: LossWeights | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-mean cross-entropy on the masked (response) tokens, and its metrics."""
    _check_columns(logp_BxL, mask_BxL, entropy_BxL)
    mask_BxL = mask_BxL.astype(bool)
    if weights is None:
        weights = loss_weights(mask_BxL, LossAggregation.token_mean)
    loss = -(weights.token_BxL * jnp.where(mask_BxL, logp_BxL, 0.0)).sum()
    metrics = {
        "loss": jax.lax.stop_gradient(loss),
        "response_tokens": mask_BxL.astype(jnp.float32).sum(),
    }
    if entropy_BxL is not None:
        metrics["entropy"] = (weights.token_BxL * entropy_BxL).sum()
    return loss, metrics

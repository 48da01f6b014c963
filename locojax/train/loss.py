"""The GRPO objective on token log-probs: clipped importance ratio, k3 KL, aggregation.

Every tensor is aligned to the token it scores (index l holds log p(tokens[l] | tokens[:l]));
`mask_BxL` marks response tokens, the only ones with loss and gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from compiler.vocab import LossAggregation
from locojax.train.settings import GrpoSettings


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


def k3_kl(logp_BxL: jax.Array, ref_logp_BxL: jax.Array, mask_BxL: jax.Array) -> jax.Array:
    """Schulman's k3 estimate of KL(policy || reference) per token; 0 off the mask."""
    # Masking before exp keeps off-mask garbage (e.g. -inf) from turning gradients into NaN.
    delta_BxL = jnp.where(mask_BxL, ref_logp_BxL - logp_BxL, 0.0)
    return jnp.exp(delta_BxL) - delta_BxL - 1.0


def grpo_loss(
    logp_BxL: jax.Array,
    mask_BxL: jax.Array,
    advantages_B: jax.Array,
    behaviour_logp_BxL: jax.Array,
    settings: GrpoSettings,
    *,
    ref_logp_BxL: jax.Array | None = None,
    entropy_BxL: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped-surrogate loss (+ kl_coef * k3 KL) and its metrics (token means over the mask)."""
    if settings.kl_coef > 0 and ref_logp_BxL is None:
        raise ValueError(f"kl_coef={settings.kl_coef} > 0 needs reference log-probs")
    mask_BxL = mask_BxL.astype(bool)
    adv_Bx1 = advantages_B.astype(jnp.float32)[:, None]
    ratio_BxL = jnp.exp(jnp.where(mask_BxL, logp_BxL - behaviour_logp_BxL, 0.0))
    low, high = 1.0 - settings.clip_eps, 1.0 + settings.clip_eps_high
    surrogate_BxL = jnp.minimum(ratio_BxL * adv_Bx1, jnp.clip(ratio_BxL, low, high) * adv_Bx1)
    token_loss_BxL = -surrogate_BxL
    if ref_logp_BxL is not None:
        kl_BxL = k3_kl(logp_BxL, ref_logp_BxL, mask_BxL)
        if settings.kl_coef > 0:
            token_loss_BxL = token_loss_BxL + settings.kl_coef * kl_BxL
    weights_BxL = aggregation_weights(mask_BxL, settings.aggregation, settings.max_response_len)
    loss = (weights_BxL * token_loss_BxL).sum()

    per_token = aggregation_weights(mask_BxL, LossAggregation.token_mean)

    def token_mean(x_BxL: jax.Array) -> jax.Array:
        return (per_token * jax.lax.stop_gradient(x_BxL)).sum()

    clipped_BxL = ((adv_Bx1 > 0) & (ratio_BxL > high)) | ((adv_Bx1 < 0) & (ratio_BxL < low))
    metrics = {
        "loss": jax.lax.stop_gradient(loss),
        "pg_loss": token_mean(-surrogate_BxL),
        "clip_frac": token_mean(clipped_BxL.astype(jnp.float32)),
        "ratio_mean": token_mean(ratio_BxL),
        "ratio_max": jnp.max(jnp.where(mask_BxL, jax.lax.stop_gradient(ratio_BxL), 0.0)),
        "advantage_mean": token_mean(jnp.broadcast_to(adv_Bx1, mask_BxL.shape)),
        "response_tokens": mask_BxL.sum().astype(jnp.float32),
    }
    if ref_logp_BxL is not None:
        metrics["kl"] = token_mean(kl_BxL)
    if entropy_BxL is not None:
        metrics["entropy"] = token_mean(entropy_BxL)
    return loss, metrics


def sft_loss(
    logp_BxL: jax.Array, mask_BxL: jax.Array, *, entropy_BxL: jax.Array | None = None
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-mean cross-entropy on the masked (response) tokens, and its metrics."""
    weights_BxL = aggregation_weights(mask_BxL.astype(bool), LossAggregation.token_mean)
    loss = -(weights_BxL * jnp.where(mask_BxL, logp_BxL, 0.0)).sum()
    metrics = {
        "loss": jax.lax.stop_gradient(loss),
        "response_tokens": mask_BxL.astype(jnp.float32).sum(),
    }
    if entropy_BxL is not None:
        metrics["entropy"] = (weights_BxL * entropy_BxL).sum()
    return loss, metrics

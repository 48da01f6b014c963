"""Rollout correction: each token's policy-gradient term weighted for the policy that sampled it.

    old_logp_BxL (log pi_old, the trainer's) - rollout_logp_BxL (log pi_rollout, the sampler's)
        = log rho per response token
        ──CORRECTIONS[kind].per_sequence: log rho replaced by its sum over the row's response
            (log of rho_seq = prod_t rho_t, on every token of the row), bounded by the
            sequence bounds (seq_cap, seq_low) instead of the token ones (cap, low)
        ──CORRECTIONS[kind].masks: weight rho where low <= rho <= cap, else 0 (IcePop / MIS)
          or the clamp min(rho, cap) (TIS)──> weight_BxL (no gradient)
    per-token metrics (token means over the mask in `loss._reduce`): logp_mismatch_mean
        |log pi_old - log pi_rollout|, rc_weight_mean (the weight), rc_clip_frac (clamp:
        rho > cap) or rc_mask_frac (mask: weight 0)

A batch without rollout log-probs (rollout_correction=none, the warm-up) has no weight and no
mismatch metric: nothing was measured, so nothing is reported.

References: `tis`, truncated importance sampling of the engine's samples (Yao et al. 2025,
"Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"; verl's
`tis_imp_ratio_cap`); `mis`, IcePop (Ling team 2025, Ring-1T: M(rho) = rho on [alpha, beta],
0 outside); `seq_tis` and `seq_mis`, the sequence-level truncated and masked importance
sampling of Liu, Li et al. 2025 ("When Speed Kills Stability"; verl's `rollout_is=sequence`):
min(prod_t rho_t, C) and prod_t rho_t * 1{low <= prod_t rho_t <= C}, the product taken as the
exp of the summed log-ratios (clamped to +-LOG_RATIO_BOUND first). DA's staleness correction
is the same weight, so with the default `tis` it is a clamp (verl); `mis` masks lagged tokens
instead (AReaL).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from compiler.vocab import RolloutCorrection
from locojax.train.settings import LOG_RATIO_BOUND, Bounds


@dataclass(frozen=True)
class Correction:
    """One rollout correction's shape."""

    per_sequence: bool
    """The weight of a row's product of rho (the sum of its log-ratios) on each of its
    tokens, under the sequence bounds (else each token's own rho, under the token bounds)."""
    masks: bool
    """rho where it lies in [low, cap], 0 outside (else min(rho, cap))."""


CORRECTIONS = {
    RolloutCorrection.tis: Correction(per_sequence=False, masks=False),
    RolloutCorrection.mis: Correction(per_sequence=False, masks=True),
    RolloutCorrection.seq_tis: Correction(per_sequence=True, masks=False),
    RolloutCorrection.seq_mis: Correction(per_sequence=True, masks=True),
}
"""Every correction but `none`, by name."""


DEFAULT_BOUNDS = Bounds()
"""The configuration's default bounds."""


def _sequence_sum(log_w_BxL: jax.Array, mask_BxL: jax.Array) -> jax.Array:
    """Each row's sum of log rho over its response tokens (the log of the product of its
    ratios), on every token of the row."""
    return jnp.where(mask_BxL, log_w_BxL.sum(axis=1)[:, None], 0.0)


def rollout_weight(
    old_logp_BxL: jax.Array, rollout_logp_BxL: jax.Array | None, mask_BxL: jax.Array,
    kind: RolloutCorrection, bounds: Bounds = DEFAULT_BOUNDS,
) -> tuple[jax.Array | None, dict[str, jax.Array]]:
    """The correction's per-token weight (None: no correction) and its per-token metrics.

    Args: log pi_old and log pi_rollout (BxL, aligned to tokens; `rollout_logp_BxL` None
    when the batch has none), the response mask, the correction and its `bounds`. Returns
    (weight_BxL or None, {name: BxL}); the metrics are empty without rollout log-probs.
    """
    if rollout_logp_BxL is None:
        return None, {}
    mask_BxL = mask_BxL.astype(bool)
    log_w_BxL = jnp.where(mask_BxL, old_logp_BxL - rollout_logp_BxL, 0.0)
    metrics = {"logp_mismatch_mean": jnp.abs(log_w_BxL)}
    rule = CORRECTIONS.get(RolloutCorrection(kind))
    if rule is None:
        return None, metrics
    if rule.per_sequence:
        log_w_BxL = _sequence_sum(log_w_BxL, mask_BxL)
    cap, low = bounds.of(rule.per_sequence)
    w_BxL = jnp.exp(jnp.clip(log_w_BxL, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    if rule.masks:
        keep_BxL = (w_BxL >= low) & (w_BxL <= cap)
        weight_BxL = jnp.where(keep_BxL, w_BxL, 0.0)
        metrics["rc_mask_frac"] = (mask_BxL & ~keep_BxL).astype(jnp.float32)
    else:
        weight_BxL = jnp.minimum(w_BxL, cap)
        metrics["rc_clip_frac"] = (mask_BxL & (w_BxL > cap)).astype(jnp.float32)
    metrics["rc_weight_mean"] = weight_BxL
    return jax.lax.stop_gradient(weight_BxL), metrics

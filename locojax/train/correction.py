"""Rollout correction: each token's policy-gradient term weighted for the policy that sampled it.

    old_logp_BxL (log pi_old, the trainer's) - rollout_logp_BxL (log pi_rollout, the sampler's)
        = log w per response token
        ──CORRECTIONS[kind].per_sequence: log w replaced by its mean over the row's response
            (w_seq, the geometric mean of the row's w, on every token of the row)
        ──CORRECTIONS[kind].masks: weight 1 where low <= w <= cap, else 0 (MIS / IcePop)
          or the clamp min(w, cap) (TIS)──> weight_BxL (no gradient)
    per-token metrics (token means over the mask in `loss._reduce`): logp_mismatch_mean
        |log pi_old - log pi_rollout|, rc_weight_mean (the weight), rc_clip_frac (clamp:
        w > cap) or rc_mask_frac (mask: weight 0)

A batch without rollout log-probs (rollout_correction=none, the warm-up) has no weight and no
mismatch metric: nothing was measured, so nothing is reported.

References: truncated importance sampling of the engine's samples (Yao et al. 2025, "Your
Efficient RL Framework Secretly Brings You Off-Policy RL Training"; verl's TIS and its
`rollout_is` token / geometric-mean levels); masking instead of clamping as IcePop (Ling
team, Ring-1T) and verl's rejection sampling. DA's staleness correction is the same weight,
so with the default `tis` it is a clamp (verl); `mis` masks lagged tokens instead (AReaL).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from compiler.vocab import RolloutCorrection
from locojax.train.settings import LOG_RATIO_BOUND


@dataclass(frozen=True)
class Correction:
    """One rollout correction's shape."""

    per_sequence: bool
    """The weight of a row's geometric-mean w on each of its tokens (else each token's own)."""
    masks: bool
    """Tokens whose w leaves [low, cap] weigh 0, the others 1 (else min(w, cap))."""


CORRECTIONS = {
    RolloutCorrection.tis: Correction(per_sequence=False, masks=False),
    RolloutCorrection.mis: Correction(per_sequence=False, masks=True),
    RolloutCorrection.seq_tis: Correction(per_sequence=True, masks=False),
    RolloutCorrection.seq_mis: Correction(per_sequence=True, masks=True),
}
"""Every correction but `none`, by name."""


def _sequence_mean(log_w_BxL: jax.Array, mask_BxL: jax.Array) -> jax.Array:
    """Each row's mean of log w over its response tokens, on every token of the row."""
    tokens_B = jnp.maximum(mask_BxL.sum(axis=1), 1).astype(jnp.float32)
    return jnp.where(mask_BxL, (log_w_BxL.sum(axis=1) / tokens_B)[:, None], 0.0)


def rollout_weight(
    old_logp_BxL: jax.Array, rollout_logp_BxL: jax.Array | None, mask_BxL: jax.Array,
    kind: RolloutCorrection, cap: float, low: float = 0.0,
) -> tuple[jax.Array | None, dict[str, jax.Array]]:
    """The correction's per-token weight (None: no correction) and its per-token metrics.

    Args: log pi_old and log pi_rollout (BxL, aligned to tokens; `rollout_logp_BxL` None
    when the batch has none), the response mask, the correction, its cap (> 0) and the
    mask's lower edge (0: 1 / cap). Returns (weight_BxL or None, {name: BxL}); the metrics
    are empty without rollout log-probs.
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
        log_w_BxL = _sequence_mean(log_w_BxL, mask_BxL)
    w_BxL = jnp.exp(jnp.clip(log_w_BxL, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    if rule.masks:
        keep_BxL = (w_BxL >= (low or 1.0 / cap)) & (w_BxL <= cap)
        weight_BxL = keep_BxL.astype(jnp.float32)
        metrics["rc_mask_frac"] = (mask_BxL & ~keep_BxL).astype(jnp.float32)
    else:
        weight_BxL = jnp.minimum(w_BxL, cap)
        metrics["rc_clip_frac"] = (mask_BxL & (w_BxL > cap)).astype(jnp.float32)
    metrics["rc_weight_mean"] = weight_BxL
    return jax.lax.stop_gradient(weight_BxL), metrics

"""Group-normalised advantages: each completion's reward relative to its prompt's group."""

from __future__ import annotations

import jax
import jax.numpy as jnp

ADVANTAGE_EPS = 1e-6


def group_advantages(
    rewards_PxG: jax.Array, *, normalize_std: bool = True, eps: float = ADVANTAGE_EPS
) -> jax.Array:
    """(r - group mean) / (group std + eps), or only centred when `normalize_std` is off.

    The std is the population std (ddof 0), defined for groups of one. The caller passes one
    host's groups: a group never crosses hosts, so no collective is involved.
    """
    r_PxG = jnp.asarray(rewards_PxG, jnp.float32)
    centred_PxG = r_PxG - r_PxG.mean(axis=1, keepdims=True)
    if not normalize_std:
        return centred_PxG
    return centred_PxG / (r_PxG.std(axis=1, keepdims=True) + eps)

"""Group-normalised advantages: each completion's reward relative to its prompt's group.

Host work in numpy: a CO host and the single controller's driver compute them on the CPU,
and the driver never starts a JAX backend.
"""

from __future__ import annotations

import numpy as np

ADVANTAGE_EPS = 1e-6


def group_advantages(
    rewards_PxG: np.ndarray, *, normalize_std: bool = True, eps: float = ADVANTAGE_EPS
) -> np.ndarray:
    """(r - group mean) / (group std + eps), or only centred when `normalize_std` is off.

    The std is the sample std (ddof 1), as TRL's and verl's GRPO (torch.std's default; the
    population std would make advantages sqrt(G / (G - 1)) larger, 6.9% at G = 8); a group
    of one is only centred (to 0). The caller passes one host's groups: a group never crosses
    hosts, so no collective is involved. float32.
    """
    r_PxG = np.asarray(rewards_PxG, np.float32)
    centred_PxG = r_PxG - r_PxG.mean(axis=1, keepdims=True)
    if not normalize_std or r_PxG.shape[1] < 2:
        return centred_PxG
    return centred_PxG / (r_PxG.std(axis=1, ddof=1, keepdims=True) + np.float32(eps))

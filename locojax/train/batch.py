"""The arrays one train step consumes, as frozen pytrees.

Every BxL tensor is aligned to the token it describes: `behaviour_logp_BxL[b, l]` is
log p(tokens[b, l] | tokens[b, :l]) under the policy that sampled it, 0 where unused.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

SHUFFLE_STREAM = 0x5EED
"""Mixed into the mini-batch permutation's seed, so it is not the prompt stream's."""


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class TrainBatch:
    """Sequences of one GRPO batch (prompt + completion, padded to L)."""

    tokens_BxL: jax.Array
    """int32 token ids."""
    positions_BxL: jax.Array
    """int32 RoPE positions (0 at each sequence's first real token)."""
    valid_BxL: jax.Array
    """bool: real tokens (prompt or completion); False on padding, which no query attends."""
    loss_mask_BxL: jax.Array
    """bool: completion tokens, the only ones with loss and gradient."""
    advantages_B: jax.Array
    """fp32 group-normalised advantage of each sequence."""
    behaviour_logp_BxL: jax.Array
    """fp32 log pi_old of the tokens, the ratio's denominator: the engine's log-probs at the
    sampling temperature (`algorithm.old_logprobs=rollout`) or the trainer's own forward
    before the batch's first update (`recompute`, `make_rescore_fn`)."""
    ref_logp_BxL: jax.Array | None = None
    """fp32 log-probs under the frozen reference policy (needed when kl_coef > 0)."""
    rollout_logp_BxL: jax.Array | None = None
    """fp32 log-probs under the engine's sampling distribution (temperature, top-k, top-p):
    the denominator of the rollout correction (needed unless rollout_correction=none)."""


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class SftBatch:
    """Sequences of one supervised warm-up batch."""

    tokens_BxL: jax.Array
    """int32 token ids."""
    positions_BxL: jax.Array
    """int32 RoPE positions."""
    valid_BxL: jax.Array
    """bool: real tokens."""
    loss_mask_BxL: jax.Array
    """bool: target (solution) tokens."""


def shuffled_rows(rows: dict[str, np.ndarray], minibatches: int, seed: int, step: int,
                  process: int) -> dict[str, np.ndarray]:
    """A process's train rows in a permutation drawn from (seed, step, process) when the batch
    is split into several mini-batches (the split takes rows j, j + k, ..., so the permutation
    decides which rows share an update); the rows as they are with one mini-batch.

    The same seed gives the same permutation, hence the same run."""
    if minibatches <= 1 or not rows:
        return rows
    n = len(next(iter(rows.values())))
    order = np.random.default_rng([seed, step, process, SHUFFLE_STREAM]).permutation(n)
    return {k: np.asarray(v)[order] for k, v in rows.items()}

"""GRPO training: advantages, chunked token log-probs, the loss, AdamW, one jitted step.

Data flow of one step (everything after the advantages is one jit over the global batch):

    rewards_PxG (one host's groups) --group_advantages--> advantages_PxG
    TrainBatch(tokens, positions, valid, loss_mask, advantages, behaviour_logp, ref_logp?,
               rollout_logp?)  --make_rescore_fn (optional: pi_old recomputed for several
               updates per batch, reference; with one update the loss takes pi_old as the
               stop-gradient of its own log-probs, `GrpoSettings.old_is_current`)-->
      --split into k mini-batches (rows j, j+k, ...)--> scan, one AdamW update each:
          loss_weights of the whole mini-batch (token / sequence counts, the constant)
          --split into m micro-batches--> scan, gradients summed:
              model hidden_BxLxD (remat blocks) --response columns only, logits / T,
              vocab chunks--> logp_BxT, entropy_BxT --grpo_loss (ratio per token or per
              sequence, log-ratio clamped to +-20, rollout correction of pi_old / pi_rollout:
              clamp or mask, per token or sequence))--> loss, grads
          --clip, AdamW--> params, opt_state
      --> params, opt_state, metrics (means over the mini-batches)

Modules:
    settings.py    GrpoSettings, ForwardSettings, OptimizerSettings (frozen; enums from
                   compiler.vocab)
    advantages.py  group_advantages(rewards_PxG, *, normalize_std, eps) -> advantages_PxG
    logprobs.py    token_logprobs / next_token_logprobs (exact, chunked, custom VJP)
    loss.py        grpo_loss, sft_loss, loss_weights, aggregation_weights, k3_kl (clamped),
                   log_ratio (token / GSPO sequence)
    correction.py  rollout_weight: TIS, MIS and their sequence forms (a table by
                   RolloutCorrection)
    optimizer.py   make_optimizer, learning_rate_schedule, init_opt_state, opt_state_shardings
    batch.py       TrainBatch, SftBatch (frozen pytrees, BxL tensors aligned to tokens)
    sharding.py    param_shardings(mesh, params, {path: spec}), batch_sharding, global_batch
    step.py        make_train_step, grpo_loss_fn, make_sft_step, make_logprob_fn, make_rescore_fn,
                   score_tokens, policy_logprobs, accumulate_grads

Alignment: index l of every BxL tensor describes token l, so logp_BxL[:, l] is
log p(tokens[:, l] | tokens[:, :l]) and logp_BxL[:, 0] = 0 (a prompt token, never in a loss).
Rows are a left-padded prompt of width W then T = `ForwardSettings.response_len` response
columns (L = W + T); the loss mask is False on the prompt columns. The trainer scores only
the response columns: hidden states of columns [W - 1, L - 1) go through the output head and
give log p of tokens [W, L) (BxT, column j = token W + j); log-probs it returns as BxL
(`make_logprob_fn`, `make_rescore_fn`) are 0 on columns [0, W). response_len = 0 scores
every column after the first (W = 1), as before.

Temperature: `ForwardSettings.temperature` T divides the logits before the log-softmax, so
logp, the ratio, the entropy and the KL are those of softmax(z / T), the distribution the
sampler draws from. Top-k / top-p truncation is not reproduced: the engine then samples
from q = softmax(z / T) restricted to the kept tokens and renormalised by their mass Z <= 1,
so q(x) = pi_old(x) / Z on every token it can draw. The PPO ratio pi / pi_old stays the trust
region it is meant to be, but as an importance weight for samples from q it is too large by
1 / Z on every token (most at the steps where truncation removed much mass), and pi_old's
tail outside the kept set is never sampled. `GrpoSettings.rollout_correction` (tis)
multiplies each token's term by min(pi_old / q, cap) with q the engine's `Rollout.logp_BxT` (truncation
included): that weight is Z (times the trainer/engine numerical mismatch), which corrects it.
"""

from locojax.train.advantages import group_advantages
from locojax.train.batch import SftBatch, TrainBatch
from locojax.train.logprobs import next_token_logprobs, token_logprobs
from locojax.train.loss import LossWeights, grpo_loss, loss_weights, sft_loss
from locojax.train.optimizer import init_opt_state, learning_rate_schedule, make_optimizer
from locojax.train.settings import ForwardSettings, GrpoSettings, OptimizerSettings
from locojax.train.sharding import batch_sharding, global_batch, param_shardings, replicated
from locojax.train.step import (
    make_logprob_fn,
    make_rescore_fn,
    make_sft_step,
    make_train_step,
    policy_logprobs,
    score_tokens,
)

__all__ = [
    "ForwardSettings",
    "GrpoSettings",
    "LossWeights",
    "OptimizerSettings",
    "SftBatch",
    "TrainBatch",
    "batch_sharding",
    "global_batch",
    "group_advantages",
    "grpo_loss",
    "init_opt_state",
    "learning_rate_schedule",
    "loss_weights",
    "make_logprob_fn",
    "make_optimizer",
    "make_rescore_fn",
    "make_sft_step",
    "make_train_step",
    "next_token_logprobs",
    "param_shardings",
    "policy_logprobs",
    "replicated",
    "score_tokens",
    "sft_loss",
    "token_logprobs",
]

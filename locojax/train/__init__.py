"""GRPO training: advantages, chunked token log-probs, the loss, AdamW, one jitted step.

Data flow of one step (everything after the advantages is one jit over the global batch):

    rewards_PxG (one host's groups) --group_advantages--> advantages_PxG
    TrainBatch(tokens, positions, valid, loss_mask, advantages, behaviour_logp, ref_logp?)
      --split into k mini-batches (rows j, j+k, ...)--> scan:
          model hidden_BxLxD --next_token_logprobs (vocab chunks)--> logp_BxL, entropy_BxL
          --grpo_loss--> loss, metrics --grad, clip, AdamW--> params, opt_state
      --> params, opt_state, metrics (means over the mini-batches)

Modules:
    settings.py    GrpoSettings, OptimizerSettings (frozen; enums from compiler.vocab)
    advantages.py  group_advantages(rewards_PxG, *, normalize_std, eps) -> advantages_PxG
    logprobs.py    token_logprobs / next_token_logprobs (exact, chunked, custom VJP)
    loss.py        grpo_loss, sft_loss, aggregation_weights, k3_kl
    optimizer.py   make_optimizer, learning_rate_schedule, init_opt_state, opt_state_shardings
    batch.py       TrainBatch, SftBatch (frozen pytrees, BxL tensors aligned to tokens)
    sharding.py    param_shardings(mesh, params, {path: spec}), batch_sharding, global_batch
    step.py        make_train_step, make_sft_step, make_logprob_fn, policy_logprobs

Alignment: index l of every BxL tensor describes token l, so logp_BxL[:, l] is
log p(tokens[:, l] | tokens[:, :l]) and logp_BxL[:, 0] = 0 (a prompt token, never in a loss).
"""

from locojax.train.advantages import group_advantages
from locojax.train.batch import SftBatch, TrainBatch
from locojax.train.logprobs import next_token_logprobs, token_logprobs
from locojax.train.loss import grpo_loss, sft_loss
from locojax.train.optimizer import init_opt_state, learning_rate_schedule, make_optimizer
from locojax.train.settings import GrpoSettings, OptimizerSettings
from locojax.train.sharding import batch_sharding, global_batch, param_shardings, replicated
from locojax.train.step import make_logprob_fn, make_sft_step, make_train_step, policy_logprobs

__all__ = [
    "GrpoSettings",
    "OptimizerSettings",
    "SftBatch",
    "TrainBatch",
    "batch_sharding",
    "global_batch",
    "group_advantages",
    "grpo_loss",
    "init_opt_state",
    "learning_rate_schedule",
    "make_logprob_fn",
    "make_optimizer",
    "make_sft_step",
    "make_train_step",
    "next_token_logprobs",
    "param_shardings",
    "policy_logprobs",
    "replicated",
    "sft_loss",
    "token_logprobs",
]

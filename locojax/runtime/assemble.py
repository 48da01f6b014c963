"""Builds runtime objects (architecture, tokenizer, sampling settings) from typed config.

The coordination layer's one place that turns schema dataclasses into the plain runtime
dataclasses of the pure-JAX modules, so those modules never see the config schema.
"""

from __future__ import annotations

from pathlib import Path

from compiler.config import (
    AlgorithmConfig,
    ModelConfig,
    SamplingConfig,
    TokenizerKind,
    WorkloadConfig,
)
from locojax.data import ArithSettings, WorkloadSettings
from locojax.model import ModelArch
from locojax.rewards import RewardKind, RewardSettings
from locojax.rollout.sampler import SamplingSettings
from locojax.tokenizers import Tokenizer, load_tokenizer
from locojax.train import Aggregation, GrpoSettings, OptimizerSettings, Schedule


class UserError(Exception):
    """A mistake in what the user asked for: printed as one line, exit code 2."""


def model_arch(model: ModelConfig) -> ModelArch:
    """The runtime architecture of a `conf/model` entry."""
    return ModelArch(
        num_layers=model.num_layers, hidden=model.hidden, num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads, head_dim=model.head_dim, ffn=model.ffn,
        vocab=model.vocab, tie_embeddings=model.tie_embeddings, rope_theta=model.rope_theta,
        norm_eps=model.norm_eps, qk_norm=model.qk_norm, dtype=str(model.dtype),
        max_position=model.max_position,
    )


def checkpoint_dir(model: ModelConfig) -> Path | None:
    """`model.checkpoint` as a directory that holds a Hugging Face checkpoint, or None."""
    if model.checkpoint is None:
        return None
    path = Path(model.checkpoint).expanduser()
    if not (path / "config.json").is_file():
        raise UserError(f"model.checkpoint={model.checkpoint}: no config.json in that directory")
    return path


def tokenizer_for(model: ModelConfig, vocab: int) -> Tokenizer:
    """The tokenizer `model.tokenizer` names; a checkpoint's own `tokenizer.json` when it has one."""
    ckpt = checkpoint_dir(model)
    kind = model.tokenizer
    if ckpt is not None and (ckpt / "tokenizer.json").is_file() and kind == TokenizerKind.qwen:
        kind = TokenizerKind.checkpoint
    if kind == TokenizerKind.bpe:
        raise UserError("model.tokenizer=bpe: trained per workload; sample with qwen, char or "
                        "checkpoint")
    try:
        return load_tokenizer(str(kind), checkpoint_dir=ckpt, vocab_size=vocab)
    except (ValueError, FileNotFoundError) as err:
        raise UserError(f"model.tokenizer={kind}: {err}") from err


def sampling_settings(sampling: SamplingConfig, max_new_tokens: int,
                      tokenizer: Tokenizer) -> SamplingSettings:
    """Sampling settings; `sampling.max_new_tokens` (when > 0) overrides `max_new_tokens`."""
    try:
        return SamplingSettings(
            temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
            max_new_tokens=sampling.max_new_tokens or max_new_tokens,
            stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id,
        )
    except ValueError as err:
        raise UserError(f"sampling: {err}") from err


def workload_settings(workload: WorkloadConfig) -> WorkloadSettings:
    """Runtime workload settings of the plan's `workload` section."""
    a = workload.arith
    return WorkloadSettings(
        name=workload.name, dataset=workload.dataset, dataset_config=workload.dataset_config,
        data_dir=workload.data_dir, train_split=workload.train_split,
        eval_split=workload.eval_split, question_field=workload.question_field,
        answer_field=workload.answer_field, reward=str(workload.reward),
        prompt_template=workload.prompt_template,
        arith=ArithSettings(min_operand=a.min_operand, max_operand=a.max_operand, terms=a.terms,
                            ops=a.ops, train_size=a.train_size, eval_size=a.eval_size),
    )


def reward_settings(workload: WorkloadConfig) -> RewardSettings:
    """How completions of this workload are scored."""
    return RewardSettings(kind=RewardKind(str(workload.reward)),
                          format_reward=workload.format_reward,
                          timeout_s=workload.reward_timeout_s)


def grpo_settings(algorithm: AlgorithmConfig, response_len: int, steps: int) -> GrpoSettings:
    """GRPO loss and RL-phase optimizer settings; `steps` RL steps set the cosine horizon."""
    updates = max(1, steps * algorithm.optimizer_steps_per_batch)
    return GrpoSettings(
        clip_eps=algorithm.clip_eps, clip_eps_high=algorithm.clip_eps_high,
        kl_coef=algorithm.kl_coef, aggregation=Aggregation(str(algorithm.loss_aggregation)),
        max_response_len=response_len,
        optimizer_steps_per_batch=algorithm.optimizer_steps_per_batch,
        normalize_advantage_std=algorithm.normalize_advantage_std,
        optimizer=OptimizerSettings(
            learning_rate=algorithm.learning_rate, schedule=Schedule(str(algorithm.lr_schedule)),
            warmup_steps=algorithm.warmup_steps, total_steps=updates,
            min_lr_ratio=algorithm.min_lr_ratio, weight_decay=algorithm.weight_decay,
            b1=algorithm.adam_b1, b2=algorithm.adam_b2, grad_clip=algorithm.grad_clip,
        ),
    )


def sft_optimizer(algorithm: AlgorithmConfig) -> OptimizerSettings:
    """Optimizer of the supervised warm-up: constant rate, same AdamW and clipping."""
    return OptimizerSettings(
        learning_rate=algorithm.sft_learning_rate, total_steps=max(1, algorithm.sft_warmup_steps),
        weight_decay=algorithm.weight_decay, b1=algorithm.adam_b1, b2=algorithm.adam_b2,
        grad_clip=algorithm.grad_clip,
    )

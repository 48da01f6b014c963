"""Builds runtime objects (architecture, tokenizer, sampling settings) from typed config.

The coordination layer's one place that turns schema dataclasses into the plain runtime
dataclasses of the pure-JAX modules, so those modules never see the config schema. A runtime
field takes the config field of the same name (`copied`); only the names that differ, and the
values the plan derives, are written out.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from compiler.config import (
    AlgorithmConfig,
    ModelConfig,
    OldLogprobs,
    SamplingConfig,
    TokenizerKind,
    WorkloadConfig,
)
from compiler.model_entry import check_family, tokenizer_kind
from compiler.passes.lengths import multi_turn
from locojax.data import ArithSettings, DataError, GymSettings, Workload, WorkloadSettings
from locojax.model import ModelArch
from locojax.model.lora import LoraSpec
from locojax.rewards import RewardSettings
from locojax.rollout.engine import EngineOptions
from locojax.rollout.sampler import SamplingSettings
from locojax.runtime.errors import UserError
from locojax.tokenizers import Tokenizer, load_tokenizer
from locojax.train import ForwardSettings, GrpoSettings, OptimizerSettings

T = TypeVar("T")


def copied(cls: type[T], source: Any, keep: tuple[str, ...] = (), **given: Any) -> T:
    """A `cls` whose fields are `source`'s fields of the same name, then `given`.

    Every field of `cls` must come from `source` or `given`, or be named in `keep` (left at
    its default), so a field renamed on one side fails here instead of silently defaulting.
    """
    values = dict(given)
    for f in fields(cls):
        if f.name in values or f.name in keep:
            continue
        if not hasattr(source, f.name):
            raise TypeError(f"{cls.__name__}.{f.name}: no field of that name in "
                            f"{type(source).__name__}; pass it or keep its default")
        values[f.name] = getattr(source, f.name)
    return cls(**values)


def model_arch(model: ModelConfig) -> ModelArch:
    """The runtime architecture of a `conf/model` entry (PlanError for a plan-only family)."""
    check_family(model)
    return copied(ModelArch, model, dtype=str(model.dtype), param_dtype=str(model.param_dtype))


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
    kind = tokenizer_kind(model)
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
        return copied(SamplingSettings, sampling, keep=("logit_bias",),
                      max_new_tokens=sampling.max_new_tokens or max_new_tokens,
                      stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id)
    except ValueError as err:
        raise UserError(f"sampling: {err}") from err


def engine_options(sampling: SamplingConfig, slots: int, store_prompts: int = 0) -> EngineOptions:
    """How the rollout engine runs: the plan's `slots` and prompt store (`prompt_store_rows`;
    0: every prompt), schedule, kernels and KV dtype."""
    return EngineOptions(slots=slots, store_prompts=store_prompts, schedule=sampling.schedule,
                         cpu_kernels=sampling.cpu_kernels,
                         kv_dtype=None if sampling.kv_dtype is None else str(sampling.kv_dtype))


def workload_settings(workload: WorkloadConfig) -> WorkloadSettings:
    """Runtime workload settings of the plan's `workload` section."""
    return copied(WorkloadSettings, workload, arith=copied(ArithSettings, workload.arith),
                  reasoning_gym=copied(GymSettings, workload.reasoning_gym),
                  columns=multi_turn(workload))


def reward_settings(workload: WorkloadConfig) -> RewardSettings:
    """How completions of this workload are scored."""
    return copied(RewardSettings, workload, kind=workload.reward,
                  timeout_s=workload.reward_timeout_s, memory_mb=workload.reward_memory_mb,
                  reward_fns=dict(workload.reward_fns),
                  reward_weights=dict(workload.reward_weights))


def forward_settings(algorithm: AlgorithmConfig, response_len: int, *, temperature: float = 1.0,
                     micro_batches: int = 1, keep_probs: bool = False,
                     fused_attention: bool = False) -> ForwardSettings:
    """How the trainer scores tokens: the plan's response length, micro-batches, head mode
    (`batch.keep_head_probs`) and attention (`batch.fused_attention`), the sampling
    temperature (a greedy sampler's 0 scores at 1, as the engine records it)."""
    return ForwardSettings(response_len=response_len, temperature=temperature or 1.0,
                           remat=algorithm.remat, micro_batches=micro_batches,
                           keep_probs=keep_probs, fused_attention=fused_attention)


def grpo_settings(algorithm: AlgorithmConfig, response_len: int, steps: int, *,
                  temperature: float = 1.0, micro_batches: int = 1,
                  keep_probs: bool = False, fused_attention: bool = False) -> GrpoSettings:
    """GRPO loss and RL-phase optimizer settings; `steps` RL steps set the cosine horizon;
    `temperature` (`sampling.temperature`), `micro_batches` (`batch.micro_batches`),
    `keep_probs` (`batch.keep_head_probs`) and `fused_attention` as in `forward_settings`."""
    updates = max(1, steps * algorithm.optimizer_steps_per_batch)
    optimizer = copied(OptimizerSettings, algorithm, keep=("eps",), schedule=algorithm.lr_schedule,
                       total_steps=updates, b1=algorithm.adam_b1, b2=algorithm.adam_b2,
                       learning_rate=algorithm.rl_learning_rate)
    forward = forward_settings(algorithm, response_len, temperature=temperature,
                               micro_batches=micro_batches, keep_probs=keep_probs,
                               fused_attention=fused_attention)
    current = algorithm.old_logprobs == OldLogprobs.recompute and not algorithm.old_forward
    return copied(GrpoSettings, algorithm, aggregation=algorithm.loss_aggregation,
                  max_response_len=response_len, forward=forward, optimizer=optimizer,
                  old_is_current=current)


def lora_spec(algorithm: AlgorithmConfig) -> LoraSpec | None:
    """The adapters `algorithm.lora` asks for; None at rank 0 (full fine-tuning)."""
    lora = algorithm.lora
    if lora.rank == 0:
        return None
    return LoraSpec(rank=lora.rank, alpha=lora.alpha, targets=tuple(lora.targets))


def sft_optimizer(algorithm: AlgorithmConfig) -> OptimizerSettings:
    """Optimizer of the supervised warm-up: constant rate, same AdamW and clipping."""
    return OptimizerSettings(
        learning_rate=algorithm.sft_learning_rate, total_steps=max(1, algorithm.sft_warmup_steps),
        weight_decay=algorithm.weight_decay, b1=algorithm.adam_b1, b2=algorithm.adam_b2,
        grad_clip=algorithm.grad_clip,
    )


def check_alphabet(workload: Workload, tokenizer: Tokenizer, template: str) -> None:
    """`DataError` (one line naming the first row and its characters) when a problem's text
    or the prompt template holds characters the tokenizer cannot encode (the char
    tokenizer's alphabet): refused at start, not at the step that samples the row. Rows read
    from data (lists) are checked; `arith`'s generated ones (`ArithTrain`) are made of digits
    and the operators the compiler allows, which every tokenizer encodes."""
    for split, problems in (("train", workload.train), ("eval", workload.eval)):
        if not isinstance(problems, list):
            continue
        texts = [template.replace("{question}", ""),
                 *(p.question if p.messages is None else "".join(c for _, c in p.messages)
                   for p in problems)]
        bad = tokenizer.unknown_characters(texts)
        if bad:
            i, chars = bad[0]
            where = "workload.prompt_template" if i == 0 else f"{split} row {problems[i - 1].uid}"
            raise DataError(f"{where}: characters {''.join(chars)!r} are outside the "
                            f"{tokenizer.name!r} tokenizer's alphabet ({len(bad)} such texts in "
                            f"{split}); use a tokenizer that has them (model.tokenizer=qwen) or "
                            "drop those rows")

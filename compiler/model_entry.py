"""A model entry against what exists: a Hugging Face checkpoint's `config.json`, and the
decoder families the runtime has a model for. Plain Python.

    model_numbers(config_json_dict) -> {ModelConfig / ModelArch field: value}
    checkpoint_model(model) -> ModelConfig   `model=hf`: numbers filled from the checkpoint;
                                             any other entry: checked against it
    check_family(model)                      PlanError when a training or sampling run
                                             cannot build it (model.family)
    check_training(cfg)                      check_family, and what only training refuses
                                             (sampling.temperature=0)
    with_compute_dtype(model, platform)      `model.dtype: null` made the platform's
                                             default (float32 on CPU, else bfloat16)
    TOKENIZER_IDS                            ids each built-in tokenizer kind needs

One reader for both halves: the compiler fills `model=hf` and checks other entries against a
`model.checkpoint`, and the runtime model (`locojax.model.arch_from_hf_config`) builds its
`ModelArch` from the same dict. `model_numbers` returns plain numbers keyed by field name,
so the pure-JAX model code may import this module (the import-rule test allows it).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from compiler.config import Config, DType, ModelConfig, ModelFamily, TokenizerKind
from compiler.errors import PlanError
from compiler.families import FAMILIES, family_of_model_type
from compiler.hf_config import (
    check_semantics,
    full_layer_config,
    nope_numbers,
    rope_scaling,
    sliding_numbers,
)

RUNTIME_FAMILIES: frozenset[ModelFamily] = frozenset(FAMILIES)
"""Decoder families the runtime has a model for; other entries are for plan inspection."""

TOKENIZER_IDS = {TokenizerKind.qwen: 151669, TokenizerKind.char: 29, TokenizerKind.ascii: 100,
                 TokenizerKind.bpe: 261}
"""Ids each tokenizer kind needs (bpe: its fixed specials and bytes); a test holds these
against the runtime tokenizers. `checkpoint` reads its count from the checkpoint's files."""



def check_family(model: ModelConfig) -> None:
    """PlanError (key `model.family`) unless the runtime can build `model`. Asked by the
    entry point of a training run before anything imports JAX, and by the runtime before it
    builds a model (sampling too); plan inspection never asks."""
    if model.family in RUNTIME_FAMILIES:
        return
    raise PlanError("model.family", model.family,
                    f"the runtime has no {model.family} model (it runs "
                    f"{', '.join(sorted(RUNTIME_FAMILIES))}); model={model.name} is for plan "
                    f"inspection: python -m locojax.plan model={model.name}", "runtime_family")


def check_training(cfg: Config) -> None:
    """PlanError for what only a training run refuses, asked by its entry point (and a
    training sweep's check) before the compiler sizes it: a family the runtime cannot build
    (`check_family`), and `sampling.temperature=0`: GRPO compares a prompt's sampled
    completions, and a greedy group is one completion repeated (zero advantage, no signal).
    Plan inspection, `locojax-eval` and `locojax-sample` may decode greedily."""
    check_family(cfg.model)
    if cfg.sampling.temperature == 0:
        raise PlanError("sampling.temperature", cfg.sampling.temperature,
                        "must be > 0 for training: a greedy group is one completion repeated, "
                        "with no advantage to learn from (locojax-eval and locojax-sample may "
                        "use 0)", "training_sampling")


def platform_dtype(platform: str) -> DType:
    """The compute dtype of `platform` (a JAX platform: cpu, gpu, tpu): float32 on CPU, where
    bf16 matmuls are ~12x slower, bfloat16 on accelerators."""
    return DType.float32 if platform == "cpu" else DType.bfloat16


def with_compute_dtype(model: ModelConfig, platform: str) -> ModelConfig:
    """`model` with its compute dtype: as set, or `platform_dtype` when `model.dtype` is None."""
    return model if model.dtype is not None else replace(model, dtype=platform_dtype(platform))


def model_numbers(config: dict[str, Any]) -> dict[str, Any]:
    """The family and architecture numbers of a Qwen3, Qwen2, Llama, Gemma 3 or SmolLM3
    `config.json` (transformers 4.x or 5.x layout), an absent key read as the family's
    transformers config class defaults it (`Family.with_class_defaults`).

    ValueError naming the field for what the runtime cannot run or a field of the wrong type
    (`compiler.hf_config.check_semantics`).
    """
    config = family_of_model_type(config.get("model_type")).with_class_defaults(config)
    family = check_semantics(config)
    rope = full_layer_config(config).get("rope_parameters") or {}
    heads = config["num_attention_heads"]
    return {
        "family": family.name,
        "num_layers": config["num_hidden_layers"],
        "hidden": config["hidden_size"],
        "num_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads") or heads,
        "head_dim": config.get("head_dim") or config["hidden_size"] // heads,
        "ffn": config["intermediate_size"],
        "vocab": config["vocab_size"],
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
        "rope_theta": float(rope.get("rope_theta", config.get("rope_theta", family.rope_theta))),
        "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
        "qk_norm": family.qk_norm,
        "qkv_bias": family.qkv_bias,
        "rope_scaling": rope_scaling(config),
        "max_position": config.get("max_position_embeddings", 40960),
        **sliding_numbers(config, family),
        **nope_numbers(config, family),
    }


def stored_dtype(config: dict[str, Any]) -> str:
    """The dtype `config.json` says the tensors are stored in (default float32)."""
    return config.get("torch_dtype") or config.get("dtype") or "float32"


def tokenizer_kind(model: ModelConfig) -> TokenizerKind:
    """The tokenizer a run reads: `model.tokenizer`, except that the default `qwen` becomes
    `checkpoint` when model.checkpoint holds a tokenizer.json (its own ids win)."""
    root = Path(model.checkpoint).expanduser() if model.checkpoint else None
    if (model.tokenizer == TokenizerKind.qwen and root is not None
            and (root / "tokenizer.json").is_file()):
        return TokenizerKind.checkpoint
    return TokenizerKind(model.tokenizer)


def read_config(checkpoint: str | Path) -> dict[str, Any]:
    """`config.json` of a checkpoint directory (FileNotFoundError when it has none, ValueError
    when it is not a JSON object)."""
    config = json.loads((Path(checkpoint).expanduser() / "config.json").read_text())
    if not isinstance(config, dict):
        raise ValueError(f"not a JSON object but {type(config).__name__}")
    return config


def checkpoint_model(model: ModelConfig) -> ModelConfig:
    """`model` with its numbers from `model.checkpoint` (`from_checkpoint`), else unchanged.

    `model.tokenizer=qwen` becomes `checkpoint` when the checkpoint has a `tokenizer.json`
    (the runtime reads that one: a Llama or Qwen2.5 checkpoint's own vocabulary and chat
    template). Raises `PlanError` (key `model.checkpoint`) when the checkpoint is missing or
    unreadable,
    and when an entry's numbers differ from its checkpoint's: one line naming each differing
    field with the checkpoint's value and the entry's.
    """
    if model.checkpoint is None:
        if model.from_checkpoint:
            raise PlanError("model.checkpoint", None, f"model={model.name} takes its numbers "
                            "from a Hugging Face checkpoint: set model.checkpoint=<dir>",
                            "checkpoint_arch")
        return model
    try:
        numbers = model_numbers(read_config(model.checkpoint))
    except FileNotFoundError:
        raise PlanError("model.checkpoint", model.checkpoint, "no config.json in that directory",
                        "checkpoint_arch") from None
    except KeyError as err:
        raise PlanError("model.checkpoint", model.checkpoint, f"config.json: no {err}",
                        "checkpoint_arch") from None
    except (ValueError, OSError) as err:
        raise PlanError("model.checkpoint", model.checkpoint, f"config.json: {err}",
                        "checkpoint_arch") from None
    if model.tokenizer == TokenizerKind.qwen and (
            Path(model.checkpoint).expanduser() / "tokenizer.json").is_file():
        model = replace(model, tokenizer=TokenizerKind.checkpoint)  # as the runtime reads it
    if model.from_checkpoint:
        return replace(model, **numbers, source=str(Path(model.checkpoint) / "config.json"))
    diff = [f"{k} {v} (checkpoint) vs {getattr(model, k)} (model={model.name})"
            for k, v in numbers.items() if v != getattr(model, k)]
    if diff:
        raise PlanError("model.checkpoint", model.checkpoint,
                        "its config.json differs from the model entry: " + "; ".join(diff)
                        + " (model=hf takes the checkpoint's numbers)", "checkpoint_arch")
    return model

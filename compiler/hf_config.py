"""What a Hugging Face `config.json` (Qwen3, Qwen2, Llama) says the model computes, checked
before its numbers are read: every field that changes the function (model type, activation,
RoPE scaling in either spelling, sliding window, attention and MLP biases, layer types,
mixture of experts, soft-capping, quantization, dropout) is refused with its name and value
unless the runtime decoder computes the same thing with its family's options
(`compiler.families`), and every numeric field must be a number of its kind
(`vocab_size: "32"` and `num_hidden_layers: 2.0` are refused, not passed on). Plain Python.

    check_semantics(config_json_dict) -> Family   ValueError "<field>=<value>: ..." (the
                                                  caller names the file) for the first
                                                  field it refuses
    rope_scaling(config_json_dict) -> RopeScaling the RoPE rescaling it asks for
"""

from __future__ import annotations

from typing import Any

from compiler.families import Family, family_of_model_type
from compiler.sections import RopeScaling
from compiler.vocab import RopeKind

_INT_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
               "max_window_layers", "sliding_window")
_FLOAT_FIELDS = ("rope_theta", "rms_norm_eps", "attention_dropout")
_MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
_NOT_IMPLEMENTED = ("final_logit_softcapping", "attn_logit_softcapping", "quantization_config",
                    "partial_rotary_factor", "rope_local_base_freq", "no_rope_layers",
                    "query_pre_attn_scalar")
"""Fields that change what the model computes and that the runtime decoder does not implement:
refused whenever set (not null)."""
_ROPE_FIELDS = {"factor": "factor", "original_max_position_embeddings": "original_max_position",
                "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
                "beta_fast": "beta_fast", "beta_slow": "beta_slow",
                "attention_factor": "attention_factor"}
"""RoPE-scaling keys of config.json -> `RopeScaling` fields."""
_ROPE_REFUSED = ("mscale", "mscale_all_dim", "short_factor", "long_factor")
"""RoPE-scaling keys whose variants (DeepSeek's yarn, longrope) the runtime does not compute."""


def _check_types(config: dict[str, Any]) -> None:
    """ValueError naming the first numeric field that is not a number of its kind (a JSON
    string "32" or a float 2.0 where an integer belongs)."""
    for key in _INT_FIELDS:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{key}={value!r}: must be an integer")
    rope = config.get("rope_parameters")
    nested = rope if isinstance(rope, dict) else {}
    for key in _FLOAT_FIELDS:
        for value in (config.get(key), nested.get(key)):
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, int | float)):
                raise ValueError(f"{key}={value!r}: must be a number")
    tie = config.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ValueError(f"tie_word_embeddings={tie!r}: must be true or false")


def _rope_dict(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(kind, keys) of the RoPE scaling in either spelling (`rope_parameters` / `rope_scaling`,
    `rope_type` / the older `type`); ("default", {}) when unscaled."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = config.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise ValueError(f"{key}={rope!r}: must be an object or null")
        kind = rope.get("rope_type", rope.get("type"))
        if kind not in (None, "default"):
            return kind, rope
    return "default", {}


def rope_scaling(config: dict[str, Any]) -> RopeScaling:
    """The `RopeScaling` config.json asks for; ValueError naming an unknown `rope_type`, a key
    of a variant the runtime does not compute, or a value that is not a number."""
    kind, rope = _rope_dict(config)
    if kind not in RopeKind.__members__:
        raise ValueError(f"rope_type={kind!r} is not supported; supported: "
                         f"{', '.join(RopeKind.__members__)}")
    for key in _ROPE_REFUSED:
        if rope.get(key) is not None:
            raise ValueError(f"rope_scaling.{key}={rope[key]!r} is not supported (rope_type="
                             f"{kind!r} without it only)")
    if rope.get("truncate", True) is not True:
        raise ValueError(f"rope_scaling.truncate={rope['truncate']!r} is not supported "
                         "(yarn's default, true, only)")
    values = {}
    for key, name in _ROPE_FIELDS.items():
        value = rope.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"rope_scaling.{key}={value!r}: must be a number")
        values[name] = int(value) if name == "original_max_position" else float(value)
    return RopeScaling(kind=RopeKind(kind), **values)


def _sliding_layers(config: dict[str, Any]) -> list[int]:
    """Layers that attend over a window shorter than `max_position_embeddings` (HF Qwen3:
    `use_sliding_window` with a `sliding_window`, from layer `max_window_layers` on)."""
    window = config.get("sliding_window")
    if not config.get("use_sliding_window", False) or window is None:
        return []
    if window >= config.get("max_position_embeddings", 40960):
        return []
    first = config.get("max_window_layers") or 0
    return list(range(first, config["num_hidden_layers"]))


def check_semantics(config: dict[str, Any]) -> Family:
    """The family of `config.json`; ValueError naming the first field that makes the
    checkpoint compute a function the runtime decoder does not (each is refused, none
    silently ignored)."""
    family = family_of_model_type(config.get("model_type"))
    _check_types(config)
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key, False) and not (key == "attention_bias" and family.qkv_bias):
            raise ValueError(f"{key}=true is not supported: the runtime decoder has no bias "
                             f"on that {family.model_type} projection")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported; the runtime decoder uses silu")
    rope_scaling(config)
    sliding = _sliding_layers(config)
    if sliding:
        raise ValueError(f"use_sliding_window=true with sliding_window="
                         f"{config['sliding_window']} (layers {sliding[0]}-{sliding[-1]}) is "
                         "not supported; the runtime decoder attends over every position")
    kinds = config.get("layer_types")
    if kinds is not None and (not isinstance(kinds, list)
                              or any(k != "full_attention" for k in kinds)):
        raise ValueError(f"layer_types={kinds!r}: only full_attention layers are supported")
    for key in _MOE_FIELDS:
        if config.get(key):
            raise ValueError(f"{key}={config[key]!r}: mixture-of-experts layers are not "
                             "supported by the runtime decoder")
    if config.get("attention_dropout"):
        raise ValueError(f"attention_dropout={config['attention_dropout']}: dropout is not "
                         "supported (0 only)")
    for key in _NOT_IMPLEMENTED:
        if config.get(key) is not None:
            raise ValueError(f"{key}={config[key]!r} is not supported by the runtime decoder")
    return family

"""What a Hugging Face Qwen3 `config.json` says the model computes, checked before its numbers
are read: every field that changes the function (activation, RoPE scaling in either spelling,
sliding window, attention bias, layer types, mixture of experts, soft-capping, quantization,
dropout) is refused with its name and value unless the Qwen3 runtime model computes the same
thing, and every numeric field must be a number of its kind (`vocab_size: "32"` and
`num_hidden_layers: 2.0` are refused, not passed on to the model). Plain Python.

    check_semantics(config_json_dict)    ValueError "<field>=<value>: ..." (the caller names
                                         the file) for the first field it refuses
"""

from __future__ import annotations

from typing import Any

_INT_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
               "max_window_layers", "sliding_window")
_FLOAT_FIELDS = ("rope_theta", "rms_norm_eps", "attention_dropout")
_MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
_NOT_IMPLEMENTED = ("final_logit_softcapping", "attn_logit_softcapping", "quantization_config",
                    "partial_rotary_factor", "rope_local_base_freq")
"""Fields that change what the model computes and that the Qwen3 runtime does not implement:
refused whenever set (not null)."""


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


def _rope_type(config: dict[str, Any]) -> Any:
    """The RoPE type of either spelling (`rope_parameters` / `rope_scaling`, `rope_type` /
    the older `type`); None when unscaled."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = config.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise ValueError(f"{key}={rope!r}: must be an object or null")
        kind = rope.get("rope_type", rope.get("type"))
        if kind not in (None, "default"):
            return kind
    return None


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


def check_semantics(config: dict[str, Any]) -> None:
    """ValueError naming the first `config.json` field that makes the checkpoint compute a
    function the Qwen3 runtime model does not (each is refused, none silently ignored)."""
    if config.get("model_type") != "qwen3":
        raise ValueError(f"model_type={config.get('model_type')!r}; only 'qwen3' is supported")
    _check_types(config)
    if config.get("attention_bias", False):
        raise ValueError("attention_bias=true is not supported by the Qwen3 runtime model")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported; the Qwen3 runtime model "
                         "uses silu")
    rope_type = _rope_type(config)
    if rope_type is not None:
        raise ValueError(f"rope_type={rope_type!r} (RoPE scaling) is not supported; only "
                         "default RoPE")
    sliding = _sliding_layers(config)
    if sliding:
        raise ValueError(f"use_sliding_window=true with sliding_window="
                         f"{config['sliding_window']} (layers {sliding[0]}-{sliding[-1]}) is "
                         "not supported; the Qwen3 runtime model attends over every position")
    kinds = config.get("layer_types")
    if kinds is not None and (not isinstance(kinds, list)
                              or any(k != "full_attention" for k in kinds)):
        raise ValueError(f"layer_types={kinds!r}: only full_attention layers are supported")
    for key in _MOE_FIELDS:
        if config.get(key):
            raise ValueError(f"{key}={config[key]!r}: mixture-of-experts layers are not "
                             "supported by the Qwen3 runtime model")
    if config.get("attention_dropout"):
        raise ValueError(f"attention_dropout={config['attention_dropout']}: dropout is not "
                         "supported (0 only)")
    for key in _NOT_IMPLEMENTED:
        if config.get(key) is not None:
            raise ValueError(f"{key}={config[key]!r} is not supported by the Qwen3 runtime "
                             "model")

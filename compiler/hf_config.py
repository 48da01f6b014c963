"""What a Hugging Face `config.json` (Qwen3, Qwen2, Llama, Gemma 3 text, SmolLM3) says the model
computes, checked before its numbers are read: every field that changes the function (model type, activation,
RoPE scaling in either spelling, sliding window, attention and MLP biases, layer types,
mixture of experts, soft-capping, quantization, dropout) is refused with its name and value
unless the runtime decoder computes the same thing with its family's options
(`compiler.families`), and every numeric field must be a number of its kind
(`vocab_size: "32"` and `num_hidden_layers: 2.0` are refused, not passed on). Plain Python.

    check_semantics(config_json_dict) -> Family   ValueError "<field>=<value>: ..." (the
                                                  caller names the file) for the first
                                                  field it refuses
    rope_scaling(config_json_dict) -> RopeScaling the RoPE rescaling it asks for (of the
                                                  full-attention layers)
    sliding_numbers(config_json_dict) -> dict     Gemma 3's sliding layers: window, pattern,
                                                  their RoPE base, query_pre_attn_scalar
    nope_numbers(config_json_dict) -> dict        SmolLM3's layers without RoPE: their interval
"""

from __future__ import annotations

from typing import Any

from compiler.families import Family, family_of_model_type
from compiler.hf_ranges import check_numbers
from compiler.sections import RopeScaling
from compiler.vocab import RopeKind

_INT_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
               "max_window_layers", "sliding_window", "sliding_window_pattern",
               "no_rope_layer_interval")
_FLOAT_FIELDS = ("rope_theta", "rms_norm_eps", "attention_dropout", "rope_local_base_freq",
                 "query_pre_attn_scalar")
_MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
_NOT_IMPLEMENTED = ("final_logit_softcapping", "attn_logit_softcapping", "quantization_config",
                    "partial_rotary_factor", "rope_local_base_freq", "no_rope_layers",
                    "query_pre_attn_scalar", "sliding_window_pattern",
                    "use_bidirectional_attention")
"""Fields that change what the model computes and that the runtime decoder does not implement:
refused whenever set (not null), but for `_SLIDING_FIELDS` in a family with sliding layers."""
_SLIDING_FIELDS = ("rope_local_base_freq", "query_pre_attn_scalar", "sliding_window_pattern")
"""Fields a family with `sliding_layers` (Gemma 3) reads (`sliding_numbers`)."""
_LAYER_KINDS = ("sliding_attention", "full_attention")
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


def full_layer_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with `rope_parameters` those of its full-attention layers: transformers 5.x
    writes Gemma 3's as one dict per layer kind (`full_attention`, `sliding_attention`)."""
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "full_attention" in rope:
        return {**config, "rope_parameters": rope["full_attention"]}
    return config


def rope_scaling(config: dict[str, Any]) -> RopeScaling:
    """The `RopeScaling` config.json asks for (its full-attention layers'); ValueError naming
    an unknown `rope_type`, a key of a variant the runtime does not compute, or a value that
    is not a number."""
    kind, rope = _rope_dict(full_layer_config(config))
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
    if kind == RopeKind.yarn and "original_max_position" not in values:
        # transformers' yarn reads max_position_embeddings where the original is absent
        values["original_max_position"] = int(config.get("max_position_embeddings") or 0)
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


def _pattern(config: dict[str, Any]) -> int:
    """p such that layers p-1, 2p-1, ... attend over every token and the others over the
    window (`layer_types`, else `sliding_window_pattern`, transformers' default 6); 0 when
    every layer is full. ValueError naming `layer_types` when it repeats no such pattern."""
    n = config["num_hidden_layers"]
    kinds = config.get("layer_types")
    if kinds is None:
        return config.get("sliding_window_pattern") or 6
    if not isinstance(kinds, list) or len(kinds) != n or any(k not in _LAYER_KINDS
                                                              for k in kinds):
        raise ValueError(f"layer_types={kinds!r}: must list {n} of {', '.join(_LAYER_KINDS)}")
    full = [i for i, k in enumerate(kinds) if k == "full_attention"]
    p = 0 if len(full) == n else (full[0] + 1 if full else n + 1)
    if p and any((k == "full_attention") != ((i + 1) % p == 0) for i, k in enumerate(kinds)):
        raise ValueError(f"layer_types={kinds!r}: only {p - 1} sliding layers then one full, "
                         "repeated, is supported")
    return p


def _local_theta(config: dict[str, Any]) -> float:
    """The sliding layers' RoPE base (transformers 5.x: `rope_parameters.sliding_attention`,
    4.x: `rope_local_base_freq`); ValueError when they ask for a RoPE scaling."""
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "sliding_attention" in rope:
        local = rope["sliding_attention"]
        kind = local.get("rope_type", "default")
        if kind != "default":
            raise ValueError(f"rope_parameters.sliding_attention.rope_type={kind!r} is not "
                             "supported (sliding layers take plain RoPE)")
        return float(local.get("rope_theta", 10_000.0))
    return float(config.get("rope_local_base_freq", 10_000.0))


def sliding_numbers(config: dict[str, Any], family: Family) -> dict[str, Any]:
    """`ModelConfig` / `ModelArch` fields of the sliding-window layers (`sliding_window`,
    `sliding_pattern`, `rope_local_theta`, `query_pre_attn_scalar`): zeros for a family
    without them. ValueError naming the field it refuses."""
    if not family.sliding_layers:
        return {}
    pattern = _pattern(config)
    window = config.get("sliding_window")
    if pattern and window is None:
        raise ValueError("sliding_window=None: sliding layers need a window")
    scalar = config.get("query_pre_attn_scalar", 256)  # transformers' default when unset
    if scalar is None:
        raise ValueError("query_pre_attn_scalar=None: the attention scale needs a number")
    return {"sliding_window": window if pattern else 0, "sliding_pattern": pattern,
            "rope_local_theta": _local_theta(config) if pattern else 0.0,
            "query_pre_attn_scalar": float(scalar)}


def nope_numbers(config: dict[str, Any], family: Family) -> dict[str, Any]:
    """`ModelConfig` / `ModelArch`'s `nope_interval` p of a family with NoPE layers (SmolLM3):
    layers p-1, 2p-1, ... apply no RoPE, as `no_rope_layers` (1: RoPE, 0: none) lists or, when
    it is absent, `no_rope_layer_interval` (transformers' default 4) says; 0 when every layer
    applies RoPE; {} for other families. ValueError for a list of another form."""
    if not family.nope_layers:
        return {}
    window = config.get("sliding_window")
    if config.get("use_sliding_window") and window is not None and window < config.get(
            "max_position_embeddings", 40960):
        raise ValueError(f"use_sliding_window=true with sliding_window={window}: SmolLM3's "
                         "sliding NoPE layers are not supported (every layer attends in full)")
    n = config.get("num_hidden_layers", 0)
    flags = config.get("no_rope_layers")
    if flags is None:
        p = config.get("no_rope_layer_interval", 4)
        if p is None or p < 1:
            raise ValueError(f"no_rope_layer_interval={p!r}: must be >= 1")
        return {"nope_interval": p if p <= n else 0}
    if not isinstance(flags, list) or len(flags) != n or any(f not in (0, 1) for f in flags):
        raise ValueError(f"no_rope_layers={flags!r}: must list 0 or 1 for each of the {n} layers")
    p = flags.index(0) + 1 if 0 in flags else 0
    if flags != [int(not p or (i + 1) % p != 0) for i in range(n)]:
        raise ValueError(f"no_rope_layers={flags!r}: only every p-th layer without RoPE "
                         f"(layers p-1, 2p-1, ...) is supported")
    return {"nope_interval": p}


def _check_layer_kinds(config: dict[str, Any], family: Family) -> None:
    """ValueError for sliding layers a family without them would ignore (Qwen3's
    `use_sliding_window`, `layer_types` other than full), and for Gemma's unreadable ones."""
    nope_numbers(config, family)
    if family.sliding_layers:
        sliding_numbers(config, family)
        return
    sliding = _sliding_layers(config)
    if sliding:
        raise ValueError(f"use_sliding_window=true with sliding_window="
                         f"{config['sliding_window']} (layers {sliding[0]}-{sliding[-1]}) is "
                         "not supported; the runtime decoder attends over every position")
    kinds = config.get("layer_types")
    if kinds is not None and (not isinstance(kinds, list)
                              or any(k != "full_attention" for k in kinds)):
        raise ValueError(f"layer_types={kinds!r}: only full_attention layers are supported")


def check_semantics(config: dict[str, Any]) -> Family:
    """The family of `config.json`; ValueError naming the first field that makes the
    checkpoint compute a function the runtime decoder does not (each is refused, none
    silently ignored)."""
    family = family_of_model_type(config.get("model_type"))
    _check_types(config)
    check_numbers(config)  # issue 62: numbers a model can have, before any tensor is read
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key, False) and not (key == "attention_bias" and family.qkv_bias):
            raise ValueError(f"{key}=true is not supported: the runtime decoder has no bias "
                             f"on that {family.model_type} projection")
    act_key = "hidden_activation" if "hidden_activation" in config else "hidden_act"
    act = config.get(act_key) or family.activation
    if act != family.activation:
        raise ValueError(f"{act_key}={act!r} is not supported; the runtime decoder's "
                         f"{family.model_type} uses {family.activation}")
    rope_scaling(config)
    _check_layer_kinds(config, family)
    for key in _MOE_FIELDS:
        if config.get(key):
            raise ValueError(f"{key}={config[key]!r}: mixture-of-experts layers are not "
                             "supported by the runtime decoder")
    if config.get("attention_dropout"):
        raise ValueError(f"attention_dropout={config['attention_dropout']}: dropout is not "
                         "supported (0 only)")
    for key in _NOT_IMPLEMENTED:
        if (family.sliding_layers and key in _SLIDING_FIELDS
                or family.nope_layers and key == "no_rope_layers"):
            continue
        if config.get(key) is not None and config.get(key) is not False:
            raise ValueError(f"{key}={config[key]!r} is not supported by the runtime decoder")
    return family

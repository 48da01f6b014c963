"""The config.json keys a family's export adds to the common ones (`Family.config_keys`).

    ModelArch (any object with its fields) --<family>_keys--> {key: value} merged into
                                                             hf_config_from_arch's dict

Plain Python: `arch` is read by attribute (`locojax.model.arch.ModelArch`'s fields), so the
compiler's family records hold these without importing the runtime.
"""

from __future__ import annotations

from typing import Any


def no_keys(arch: Any, rope: dict[str, Any] | None) -> dict[str, Any]:
    """A family whose config.json has only the common keys."""
    return {}


def gemma3_keys(arch: Any, rope: dict[str, Any] | None) -> dict[str, Any]:
    """Gemma 3's keys: the layer kinds and RoPE per kind (transformers 5.x `layer_types` and
    `rope_parameters` by kind; 4.x `sliding_window_pattern`, `rope_local_base_freq`)."""
    kinds = ["sliding_attention" if s else "full_attention" for s in arch.sliding_layers]
    local = arch.rope_local_theta or 10_000.0
    scalar = arch.query_pre_attn_scalar or arch.head_dim
    return {
        "hidden_activation": arch.options.activation,
        # An int where it is one: transformers 5.x's strict Gemma3TextConfig refuses 256.0.
        "query_pre_attn_scalar": int(scalar) if float(scalar).is_integer() else scalar,
        "sliding_window": arch.sliding_window or arch.max_position,
        "layer_types": kinds,
        "sliding_window_pattern": arch.sliding_pattern or arch.num_layers + 1,
        "rope_local_base_freq": local,
        "rope_parameters": {
            "full_attention": {"rope_theta": arch.rope_theta, "rope_type": "default",
                               **(rope or {})},
            "sliding_attention": {"rope_theta": local, "rope_type": "default"}},
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    }


def smollm3_keys(arch: Any, rope: dict[str, Any] | None) -> dict[str, Any]:
    """SmolLM3's keys: each layer's RoPE flag (1: RoPE, 0: none) and their interval; the
    special token ids its config class defaults to (pad 128004, bos 128000, eos 128001) as null
    where they lie outside the vocabulary (torch's embedding refuses such a pad row)."""
    ids = {"pad_token_id": 128_004, "bos_token_id": 128_000, "eos_token_id": 128_001}
    return {**{k: v if v < arch.vocab else None for k, v in ids.items()},
            "no_rope_layers": [int(r) for r in arch.rope_layers],
            "no_rope_layer_interval": arch.nope_interval or arch.num_layers + 1,
            "layer_types": ["full_attention"] * arch.num_layers}

"""The numbers of a Hugging Face `config.json` that a model can have, checked before any tensor
is read: a hundred thousand layers, a negative vocabulary or a head count that does not divide
is one line naming the key (ValueError; the caller names the file), not an allocation or a
shape error from deep inside JAX. Plain Python.

    check_numbers(config_json_dict)   ValueError "<key>=<value>: must be ..." for the first
                                      number out of its range (after `hf_config`'s type check)

The bounds are far past every model of the families the runtime builds (docs/errors.md).
"""

from __future__ import annotations

from typing import Any

RANGES: dict[str, tuple[float, float]] = {
    "num_hidden_layers": (1, 1024),
    "hidden_size": (1, 1 << 17),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096),
    "intermediate_size": (1, 1 << 20),
    "vocab_size": (1, 1 << 23),
    "max_position_embeddings": (1, 1 << 27),
    "sliding_window": (1, 1 << 27),
}
"""config.json key -> [least, most] it may be, when it is set (not null)."""
POSITIVE = ("rope_theta", "rms_norm_eps", "rope_local_base_freq", "query_pre_attn_scalar")
"""Keys that must be a positive number when set (an eps below 1 too)."""


def check_numbers(config: dict[str, Any]) -> None:
    """ValueError naming the first key of `config` whose number is out of its range
    (`RANGES`, `POSITIVE`), or whose heads do not divide: num_key_value_heads must divide
    num_attention_heads, and without head_dim the heads must divide hidden_size."""
    for key, (lo, hi) in RANGES.items():
        value = config.get(key)
        if value is not None and not lo <= value <= hi:
            raise ValueError(f"{key}={value!r}: must be in [{lo}, {hi:,}]")
    for key in POSITIVE:
        value = config.get(key)
        if value is not None and not (value > 0 and (key != "rms_norm_eps" or value < 1)):
            raise ValueError(f"{key}={value!r}: must be a positive number"
                             + (" below 1" if key == "rms_norm_eps" else ""))
    heads = config.get("num_attention_heads")
    kv = config.get("num_key_value_heads")
    if heads is not None and kv is not None and heads % kv:
        raise ValueError(f"num_attention_heads={heads}: must be a multiple of "
                         f"num_key_value_heads={kv}")
    hidden = config.get("hidden_size")
    if config.get("head_dim") is None and heads and hidden is not None and hidden % heads:
        raise ValueError(f"hidden_size={hidden}: must be a multiple of num_attention_heads="
                         f"{heads} when config.json has no head_dim")

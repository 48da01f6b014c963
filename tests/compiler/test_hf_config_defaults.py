"""Issue 60, item 5: a `config.json` that omits keys reads as its family's transformers config
class reads it. transformers 4.x saves only the keys that differ from the class's defaults
(`to_json_string(use_diff=True)`): a Gemma 3 text checkpoint saved by 4.57.1 has no
`tie_word_embeddings` (Gemma3TextConfig's default is True), nor does SmolLM3's (its class
inherits PretrainedConfig's True)."""

import json

import pytest
from paths import FIXTURES

from compiler.families import FAMILIES
from compiler.model_entry import model_numbers

FIXTURE = {"qwen3": "tiny_qwen3", "qwen2": "tiny_qwen2", "llama": "tiny_llama",
           "gemma3": "tiny_gemma3", "smollm3": "tiny_smollm3"}

CLASS_DEFAULTS = {
    "qwen3": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "head_dim": 128, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "rope_theta": 10000.0},
    "qwen2": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "rope_theta": 10000.0},
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "rope_theta": 10000.0},
    "gemma3": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
               "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
               "head_dim": 256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
               "tie_word_embeddings": True, "rope_theta": 1_000_000.0,
               "query_pre_attn_scalar": 256, "sliding_window": 4096,
               "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6},
    "smollm3": {"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008,
                "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 4,
                "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                "tie_word_embeddings": True, "rope_theta": 2_000_000.0,
                "no_rope_layer_interval": 4},
}
"""transformers 4.57.1's config classes' defaults (Qwen3Config, Qwen2Config, LlamaConfig,
Gemma3TextConfig, SmolLM3Config), written out by hand from their `__init__` signatures."""


def _fixture(family: str) -> dict:
    return json.loads((FIXTURES / FIXTURE[family] / "config.json").read_text())


@pytest.mark.parametrize("family", sorted(FIXTURE))
def test_a_config_saved_as_a_diff_reads_as_the_whole_one(family):
    """Each fixture's config.json with every key that equals its class's default removed (as
    transformers 4.x writes it) gives the same numbers as the whole file."""
    whole = _fixture(family)
    diff = {k: v for k, v in whole.items()
            if k not in CLASS_DEFAULTS[family] or v != CLASS_DEFAULTS[family][k]}
    assert model_numbers(diff) == model_numbers(whole)


@pytest.mark.parametrize("family", sorted(FIXTURE))
def test_a_config_missing_every_optional_key_reads_the_class_defaults(family):
    """Only `model_type` (and the sliding pattern's layer kinds dropped): every number is the
    config class's."""
    numbers = model_numbers({"model_type": FAMILIES[family].model_type})
    want = CLASS_DEFAULTS[family]
    heads = want["num_attention_heads"]
    assert numbers["tie_embeddings"] is want["tie_word_embeddings"]
    assert (numbers["vocab"], numbers["hidden"], numbers["ffn"], numbers["num_layers"],
            numbers["num_heads"], numbers["num_kv_heads"], numbers["max_position"]) == (
        want["vocab_size"], want["hidden_size"], want["intermediate_size"],
        want["num_hidden_layers"], heads, want["num_key_value_heads"] or heads,
        want["max_position_embeddings"])
    assert numbers["head_dim"] == want.get("head_dim", want["hidden_size"] // heads)
    assert numbers["rope_theta"] == want["rope_theta"]
    if family == "gemma3":
        assert (numbers["sliding_window"], numbers["sliding_pattern"],
                numbers["query_pre_attn_scalar"], numbers["rope_local_theta"]) == (
            4096, 6, 256.0, 10000.0)
    if family == "smollm3":
        assert numbers["nope_interval"] == 4

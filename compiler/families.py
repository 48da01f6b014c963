"""Decoder families: what each Hugging Face `model_type` computes, as options of the one
runtime decoder (`locojax.model.qwen3.Qwen3`, built from a `ModelArch`). Plain Python.

    config.json["model_type"] --family_of_model_type--> Family --> ModelConfig / ModelArch
                                                                   options (qk_norm,
                                                                   qkv_bias, Gemma's norms,
                                                                   GeGLU, NoPE layers) and
                                                                   the export's
                                                                   model_type, architectures

A family is a record, not a branch: the reader (`compiler.hf_config`, `compiler.model_entry`)
and the exporter (`locojax.model.arch.hf_config_from_arch`) look its fields up here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compiler.family_keys import gemma3_keys, no_keys, smollm3_keys
from compiler.vocab import ModelFamily


@dataclass(frozen=True)
class Family:
    """One decoder family as the runtime computes it and as Hugging Face stores it."""

    name: ModelFamily
    """The `model.family` value."""
    model_type: str
    """config.json's `model_type` (read and written)."""
    architecture: str
    """config.json's `architectures[0]` on export (the transformers class that loads it)."""
    qk_norm: bool
    """Per-head RMSNorm on queries and keys before RoPE (Qwen3)."""
    qkv_bias: bool
    """Biases on the q/k/v projections and none on o (Qwen2). config.json's
    `attention_bias: true` (Llama, Qwen3: biases on q/k/v and o) is refused."""
    norm_offset: float = 0.0
    """RMSNorm multiplies by (norm_offset + w): 0 for w (weights built at 1), 1 for Gemma's
    (1 + w) (weights built at 0, the product taken in fp32)."""
    sandwich_norms: bool = False
    """Gemma's four norms per layer: x + post_norm(attn(norm(x))), then
    x + post_mlp_norm(mlp(mlp_norm(x))); False: the pre-norm pair only."""
    activation: str = "silu"
    """The gated MLP's activation, as config.json names it (`hidden_act`, Gemma's
    `hidden_activation`): `silu` (SwiGLU) or `gelu_pytorch_tanh` (GeGLU)."""
    embed_scale: bool = False
    """The embedding's rows are multiplied by sqrt(hidden) in the compute dtype (Gemma)."""
    sliding_layers: bool = False
    """config.json's sliding-window layers (`layer_types` or `sliding_window_pattern`,
    `sliding_window`), their RoPE base (`rope_local_base_freq`) and `query_pre_attn_scalar`
    are read (Gemma 3); for other families any of them set is refused."""
    nope_layers: bool = False
    """config.json's `no_rope_layers` / `no_rope_layer_interval` are read: layers that apply
    no RoPE (SmolLM3); for other families `no_rope_layers` set is refused."""
    rope_theta: float = 10_000.0
    """The RoPE base of a config.json that gives none: transformers' default for the family
    (its config class's `default_theta`: 10,000; Gemma 3's full layers 1e6; SmolLM3 2e6)."""
    defaults: tuple[tuple[str, Any], ...] = ()
    """config.json keys this family's transformers config class fills in when a file omits
    them (transformers 4.x writes only the keys that differ from these), beyond
    `rope_theta`: what `with_class_defaults` reads for an absent key."""
    config_keys: Callable[[Any, dict[str, Any] | None], dict[str, Any]] = no_keys
    """The keys the export adds to (or overrides in) the common ones, from the arch and its
    RoPE scaling keys (`compiler.family_keys`)."""
    layer_names: tuple[tuple[str, str], ...] = ()
    """Per-layer tensor names, our stacked name -> Hugging Face's suffix after
    `model.layers.{i}.`, where this family's differ from the shared ones
    (`locojax.model.hf_io`): Gemma's post_attention_layernorm is the norm after attention,
    not the one before the MLP."""

    def with_class_defaults(self, config: dict[str, Any]) -> dict[str, Any]:
        """`config` with every absent key of `defaults` (and `rope_theta`) as the family's
        config class sets it; keys present, null included, are kept."""
        return {**dict(self.defaults), "rope_theta": self.rope_theta, **config}


def _sizes(vocab, hidden, ffn, layers, heads, kv_heads, max_position, tie, **more):
    """A config class's defaults of the keys the reader uses (`Family.defaults`)."""
    return (("vocab_size", vocab), ("hidden_size", hidden), ("intermediate_size", ffn),
            ("num_hidden_layers", layers), ("num_attention_heads", heads),
            ("num_key_value_heads", kv_heads), ("max_position_embeddings", max_position),
            ("rms_norm_eps", 1e-6), ("tie_word_embeddings", tie), *more.items())


FAMILIES: dict[ModelFamily, Family] = {
    ModelFamily.qwen3: Family(ModelFamily.qwen3, "qwen3", "Qwen3ForCausalLM", qk_norm=True,
                              qkv_bias=False,
                              defaults=_sizes(151_936, 4096, 22_016, 32, 32, 32, 32_768, False,
                                              head_dim=128)),
    ModelFamily.qwen2: Family(ModelFamily.qwen2, "qwen2", "Qwen2ForCausalLM", qk_norm=False,
                              qkv_bias=True,
                              defaults=_sizes(151_936, 4096, 22_016, 32, 32, 32, 32_768, False)),
    ModelFamily.llama: Family(ModelFamily.llama, "llama", "LlamaForCausalLM", qk_norm=False,
                              qkv_bias=False,
                              defaults=_sizes(32_000, 4096, 11_008, 32, 32, None, 2048, False)),
    ModelFamily.gemma3: Family(ModelFamily.gemma3, "gemma3_text", "Gemma3ForCausalLM",
                               qk_norm=True, qkv_bias=False, norm_offset=1.0,
                               sandwich_norms=True, activation="gelu_pytorch_tanh",
                               embed_scale=True, sliding_layers=True, rope_theta=1_000_000.0,
                               defaults=_sizes(262_208, 2304, 9216, 26, 8, 4, 131_072, True,
                                               head_dim=256, query_pre_attn_scalar=256,
                                               sliding_window=4096,
                                               rope_local_base_freq=10_000.0),
                               config_keys=gemma3_keys,
                               layer_names=(
                                   ("layers/attn_post_norm/scale",
                                    "post_attention_layernorm.weight"),
                                   ("layers/mlp_norm/scale", "pre_feedforward_layernorm.weight"),
                                   ("layers/mlp_post_norm/scale",
                                    "post_feedforward_layernorm.weight"))),
    ModelFamily.smollm3: Family(ModelFamily.smollm3, "smollm3", "SmolLM3ForCausalLM",
                                qk_norm=False, qkv_bias=False, nope_layers=True,
                                rope_theta=2_000_000.0,
                                defaults=_sizes(128_256, 2048, 11_008, 36, 16, 4, 32_768, True,
                                                no_rope_layer_interval=4),
                                config_keys=smollm3_keys),
}
"""Every family the compiler knows, by `model.family`. `defaults` are transformers 4.57's
config classes' (Qwen3Config, Qwen2Config, LlamaConfig, Gemma3TextConfig, SmolLM3Config;
SmolLM3's `tie_word_embeddings` is PretrainedConfig's True)."""

REFUSED_MODEL_TYPES = {
    "gemma3": "a Gemma 3 vision-language checkpoint: its vision tower is not in the runtime "
              "decoder (gemma3_text checkpoints, e.g. gemma-3-1b, run)",
    "qwen3_moe": "mixture-of-experts layers are not in the runtime decoder",
    "qwen2_moe": "mixture-of-experts layers are not in the runtime decoder",
    "mistral": "Mistral's sliding-window attention is not in the runtime decoder",
}
"""model_types that look close but compute something else: the reason their refusal names."""


def family_of_model_type(model_type: object) -> Family:
    """The family whose checkpoints have this `model_type`; ValueError naming the field, the
    families supported and, for a known near miss, what the runtime lacks."""
    for family in FAMILIES.values():
        if family.model_type == model_type:
            return family
    known = ", ".join(sorted(f.model_type for f in FAMILIES.values()))
    reason = REFUSED_MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    tail = f": {reason}" if reason else ""
    raise ValueError(f"model_type={model_type!r} is not supported (supported: {known}){tail}")

"""Architecture numbers and family options of the runtime decoder, as the runtime sees them
(no config schema), and the Hugging Face `config.json` of each family they are read from and
exported to (`compiler.families`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp

from compiler.families import FAMILIES, Family
from compiler.model_entry import model_numbers, stored_dtype
from compiler.sections import RopeScaling
from compiler.vocab import ModelFamily, RopeKind

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclass(frozen=True)
class ModelArch:
    """Shape, numerics and family options of a decoder-only transformer (Qwen3 layout; the
    options make it Qwen2's, Llama's, Gemma 3's or SmolLM3's)."""

    num_layers: int
    """Decoder blocks N."""
    hidden: int
    """Model width D."""
    num_heads: int
    """Query heads H."""
    num_kv_heads: int
    """Key/value heads K; divides H."""
    head_dim: int
    """Width of one attention head."""
    ffn: int
    """SwiGLU inner width F."""
    vocab: int
    """Vocabulary size V."""
    tie_embeddings: bool = True
    """Whether the output layer is the transposed input embedding."""
    rope_theta: float = 1_000_000.0
    """RoPE base frequency."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    qk_norm: bool = True
    """RMSNorm on each query and key head before RoPE (Qwen3)."""
    qkv_bias: bool = False
    """Biases on the q, k and v projections (Qwen2)."""
    rope_scaling: RopeScaling = RopeScaling()
    """RoPE's rescaling (`locojax.model.rope`); the default is plain RoPE."""
    family: str = "qwen3"
    """The `compiler.families` entry config.json is exported as (`model_type`)."""
    dtype: str = "float32"
    """Compute type ('float32' or 'bfloat16'): activations and matmul inputs; parameters are
    cast to it in the forward pass (softmax, norm statistics, RoPE stay fp32)."""
    max_position: int = 40960
    """Longest sequence the checkpoint was trained for (exported to config.json only)."""
    param_dtype: str = "float32"
    """Storage type of newly built parameters ('float32' or 'bfloat16'): the trained master
    copy (and, through optax, its gradients and AdamW moments)."""
    sliding_window: int = 0
    """Tokens a sliding layer's query reads, its own included (query i reads key j iff
    0 <= i - j < sliding_window); 0: no sliding layers."""
    sliding_pattern: int = 0
    """Layers p-1, 2p-1, ... are full, the others sliding (`sliding_layers`); 0: all full."""
    rope_local_theta: float = 0.0
    """The sliding layers' RoPE base (plain RoPE); the full layers take `rope_theta` and
    `rope_scaling`."""
    query_pre_attn_scalar: float = 0.0
    """Scores scale by query_pre_attn_scalar^-0.5 (0: head_dim^-0.5)."""
    nope_interval: int = 0
    """Layers p-1, 2p-1, ... apply no RoPE (`rope_layers`, SmolLM3's NoPE layers); 0: all do."""

    def __post_init__(self):
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(f"{name}={getattr(self, name)!r}; expected one of "
                                 f"{sorted(_DTYPES)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.has_sliding and (self.sliding_window < 1 or self.rope_local_theta <= 0):
            raise ValueError(f"sliding_pattern={self.sliding_pattern} needs sliding_window >= 1"
                             f" and rope_local_theta > 0 (got {self.sliding_window}, "
                             f"{self.rope_local_theta})")

    @property
    def options(self) -> Family:
        """The family record whose options (norm form, sandwich norms, activation, embedding
        scale) the decoder computes with."""
        return FAMILIES[ModelFamily(self.family)]

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        """Per layer: whether it attends over the last `sliding_window` tokens only."""
        p = self.sliding_pattern
        return tuple(bool(p) and (i + 1) % p != 0 for i in range(self.num_layers))

    @property
    def has_sliding(self) -> bool:
        """Whether any layer is a sliding one (then masks and RoPE tables come in pairs)."""
        return any(self.sliding_layers)

    @property
    def rope_layers(self) -> tuple[bool, ...]:
        """Per layer: whether it rotates queries and keys by RoPE (False: a NoPE layer)."""
        p = self.nope_interval
        return tuple(not p or (i + 1) % p != 0 for i in range(self.num_layers))

    @property
    def has_nope(self) -> bool:
        """Whether any layer applies no RoPE (then each layer's flag picks its tables)."""
        return not all(self.rope_layers)

    @property
    def query_scale(self) -> float:
        """What queries are multiplied by before attention's own head_dim^-0.5, so scores
        scale by query_pre_attn_scalar^-0.5 (1.0: no multiply)."""
        if not self.query_pre_attn_scalar:
            return 1.0
        return (self.head_dim / self.query_pre_attn_scalar) ** 0.5

    @property
    def jnp_dtype(self) -> Any:
        """The JAX compute dtype (activations, matmul inputs)."""
        return _DTYPES[self.dtype]

    @property
    def jnp_param_dtype(self) -> Any:
        """The JAX dtype parameters are built in."""
        return _DTYPES[self.param_dtype]


def arch_from_hf_config(config: dict[str, Any]) -> ModelArch:
    """Read a Hugging Face Qwen3, Qwen2, Llama, Gemma 3 or SmolLM3 `config.json` dict (transformers 4.x or 5.x
    layout); ValueError naming the field it refuses."""
    dtype = stored_dtype(config)
    if dtype not in _DTYPES:
        raise ValueError(f"torch_dtype={dtype!r}; expected one of {sorted(_DTYPES)}")
    return ModelArch(**model_numbers(config), dtype=dtype)


def _rope_json(arch: ModelArch) -> dict[str, Any] | None:
    """config.json's `rope_scaling` of `arch` (None: plain RoPE), in transformers' keys."""
    r = arch.rope_scaling
    if r.kind is RopeKind.default:
        return None
    keys = {RopeKind.linear: {"factor": r.factor},
            RopeKind.llama3: {"factor": r.factor, "low_freq_factor": r.low_freq_factor,
                              "high_freq_factor": r.high_freq_factor,
                              "original_max_position_embeddings": r.original_max_position},
            RopeKind.yarn: {"factor": r.factor, "beta_fast": r.beta_fast,
                            "beta_slow": r.beta_slow,
                            "original_max_position_embeddings": r.original_max_position}}
    out = {"rope_type": r.kind.value, **keys[r.kind]}
    if r.kind is RopeKind.yarn and r.attention_factor is not None:
        out["attention_factor"] = r.attention_factor
    return out


def hf_config_from_arch(arch: ModelArch) -> dict[str, Any]:
    """The `config.json` dict transformers needs to build `arch`'s family's `*ForCausalLM`
    (`Qwen3ForCausalLM`, `Qwen2ForCausalLM`, `LlamaForCausalLM`, `Gemma3ForCausalLM`,
    `SmolLM3ForCausalLM`);
    ValueError when the family cannot hold `arch`'s options (e.g. Qwen3 without QK-norm)."""
    family = arch.options
    if (arch.qk_norm, arch.qkv_bias) != (family.qk_norm, family.qkv_bias):
        raise ValueError(f"a {family.architecture} has qk_norm={family.qk_norm} and qkv_bias="
                         f"{family.qkv_bias}; cannot export qk_norm={arch.qk_norm}, "
                         f"qkv_bias={arch.qkv_bias}")
    if arch.has_nope and not family.nope_layers:
        raise ValueError(f"a {family.architecture} applies RoPE in every layer; cannot export "
                         f"nope_interval={arch.nope_interval}")
    rope = _rope_json(arch)
    extra = family.config_keys(arch, rope)
    return {
        "architectures": [family.architecture],
        "model_type": family.model_type,
        "vocab_size": arch.vocab,
        "hidden_size": arch.hidden,
        "intermediate_size": arch.ffn,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "hidden_act": family.activation,
        "max_position_embeddings": arch.max_position,
        "rms_norm_eps": arch.norm_eps,
        # transformers 4.x reads the top-level rope_theta and rope_scaling, 5.x reads
        # rope_parameters.
        "rope_theta": arch.rope_theta,
        "rope_scaling": rope,
        "rope_parameters": {"rope_theta": arch.rope_theta, "rope_type": "default", **(rope or {})},
        "tie_word_embeddings": arch.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": arch.num_layers,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": arch.dtype,
        **extra,
    }

"""Architecture numbers of a Qwen3 decoder, as the runtime sees them (no config schema)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp

from compiler.model_entry import model_numbers, stored_dtype

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclass(frozen=True)
class ModelArch:
    """Shape and numerics of a decoder-only transformer in the Qwen3 layout."""

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
    dtype: str = "float32"
    """Compute type ('float32' or 'bfloat16'): activations and matmul inputs; parameters are
    cast to it in the forward pass (softmax, norm statistics, RoPE stay fp32)."""
    max_position: int = 40960
    """Longest sequence the checkpoint was trained for (exported to config.json only)."""
    param_dtype: str = "float32"
    """Storage type of newly built parameters ('float32' or 'bfloat16'): the trained master
    copy (and, through optax, its gradients and AdamW moments)."""

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

    @property
    def jnp_dtype(self) -> Any:
        """The JAX compute dtype (activations, matmul inputs)."""
        return _DTYPES[self.dtype]

    @property
    def jnp_param_dtype(self) -> Any:
        """The JAX dtype parameters are built in."""
        return _DTYPES[self.param_dtype]


def arch_from_hf_config(config: dict[str, Any]) -> ModelArch:
    """Read a Hugging Face Qwen3 `config.json` dict (transformers 4.x or 5.x layout)."""
    dtype = stored_dtype(config)
    if dtype not in _DTYPES:
        raise ValueError(f"torch_dtype={dtype!r}; expected one of {sorted(_DTYPES)}")
    return ModelArch(**model_numbers(config), dtype=dtype)


def hf_config_from_arch(arch: ModelArch) -> dict[str, Any]:
    """The `config.json` dict transformers needs to build `Qwen3ForCausalLM` for `arch`."""
    if not arch.qk_norm:
        raise ValueError("Qwen3ForCausalLM always has QK-norm; cannot export qk_norm=False")
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": arch.vocab,
        "hidden_size": arch.hidden,
        "intermediate_size": arch.ffn,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": arch.max_position,
        "rms_norm_eps": arch.norm_eps,
        # transformers 4.x reads the top-level rope_theta, 5.x reads rope_parameters.
        "rope_theta": arch.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_theta": arch.rope_theta, "rope_type": "default"},
        "tie_word_embeddings": arch.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": arch.num_layers,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": arch.dtype,
    }

"""The model ops a training forward runs with: XLA's, or with the TPU's fused causal attention.

    forward_ops(ForwardSettings) -> ModelOps   (`fused_attention` on TPU devices: splash)
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
from jax.sharding import NamedSharding, Sharding

from locojax.kernels import tpu_attention
from locojax.model.ops import XLA_OPS, ModelOps, blocked_masked_attention
from locojax.model.qwen3 import attention_mask
from locojax.train.settings import ForwardSettings


@dataclass(frozen=True)
class SplashCausal:
    """`ModelOps.causal_attention` through splash attention, per device over the rows'
    sharding; rows that do not tile take XLA's masked softmax under the same rule."""

    rows: Sharding | None = None
    interpret: bool = False

    def __call__(self, q_BxLxHxhd, k_BxLxKxhd, v_BxLxKxhd, valid_BxL):
        b, length = valid_BxL.shape
        if not tpu_attention.applies(length):
            mask = attention_mask(b, length, length, 0, valid_BxL)
            return blocked_masked_attention(q_BxLxHxhd, k_BxLxKxhd, v_BxLxKxhd, mask)
        rows = self.rows if isinstance(self.rows, NamedSharding) else None
        return tpu_attention.causal_attention(q_BxLxHxhd, k_BxLxKxhd, v_BxLxKxhd, valid_BxL,
                                              rows=rows, interpret=self.interpret)


def _platform(forward: ForwardSettings) -> str:
    """Where the forward runs: its activations' devices, else JAX's default backend."""
    sharding = forward.activation_sharding
    if isinstance(sharding, NamedSharding):
        return sharding.mesh.devices.flat[0].platform
    return jax.default_backend()


def forward_ops(forward: ForwardSettings) -> ModelOps:
    """The ops of a training or scoring forward with `forward`'s settings."""
    if forward.fused_attention and _platform(forward) == "tpu":
        return ModelOps(causal_attention=SplashCausal(forward.activation_sharding))
    return XLA_OPS

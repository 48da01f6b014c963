"""The parameter table of a decoder: every parameter's name, shape and logical axes.

This is the contract between the compiler (which assigns a PartitionSpec to each entry) and
the runtime model (whose parameter tree must have exactly these paths, shapes and logical
axes; a test checks it). Layers are stacked on a leading `layers` dimension. Names follow
the runtime's nesting joined by '/'.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from compiler.axes import LogicalAxis as A
from compiler.config import ModelConfig
from compiler.families import FAMILIES
from compiler.sections import LORA_TARGETS, LoraConfig


@dataclass(frozen=True)
class ParamInfo:
    """One parameter: path, shape and the logical name of each dimension."""

    name: str
    shape: tuple[int, ...]
    axes: tuple[A, ...]

    @property
    def size(self) -> int:
        """Number of elements."""
        return prod(self.shape)


def param_table(model: ModelConfig) -> tuple[ParamInfo, ...]:
    """Every parameter of `model`, in a fixed order."""
    n, d, h, k = model.num_layers, model.hidden, model.num_heads, model.num_kv_heads
    hd, f, v = model.head_dim, model.ffn, model.vocab
    table = [
        ParamInfo("embed/embedding", (v, d), (A.VOCAB, A.EMBED)),
        ParamInfo("layers/attn_norm/scale", (n, d), (A.LAYERS, A.NORM)),
        ParamInfo("layers/attn/q_proj", (n, d, h, hd), (A.LAYERS, A.EMBED, A.HEADS, A.HEAD_DIM)),
        ParamInfo("layers/attn/k_proj", (n, d, k, hd), (A.LAYERS, A.EMBED, A.KV_HEADS, A.HEAD_DIM)),
        ParamInfo("layers/attn/v_proj", (n, d, k, hd), (A.LAYERS, A.EMBED, A.KV_HEADS, A.HEAD_DIM)),
        ParamInfo("layers/attn/o_proj", (n, h, hd, d), (A.LAYERS, A.HEADS, A.HEAD_DIM, A.EMBED)),
    ]
    if model.qkv_bias:
        table += [
            ParamInfo("layers/attn/q_bias", (n, h, hd), (A.LAYERS, A.HEADS, A.HEAD_DIM)),
            ParamInfo("layers/attn/k_bias", (n, k, hd), (A.LAYERS, A.KV_HEADS, A.HEAD_DIM)),
            ParamInfo("layers/attn/v_bias", (n, k, hd), (A.LAYERS, A.KV_HEADS, A.HEAD_DIM)),
        ]
    if model.qk_norm:
        table += [
            ParamInfo("layers/attn/q_norm/scale", (n, hd), (A.LAYERS, A.HEAD_DIM)),
            ParamInfo("layers/attn/k_norm/scale", (n, hd), (A.LAYERS, A.HEAD_DIM)),
        ]
    if model.family in FAMILIES and FAMILIES[model.family].sandwich_norms:
        table += [
            ParamInfo("layers/attn_post_norm/scale", (n, d), (A.LAYERS, A.NORM)),
            ParamInfo("layers/mlp_post_norm/scale", (n, d), (A.LAYERS, A.NORM)),
        ]
    table += [
        ParamInfo("layers/mlp_norm/scale", (n, d), (A.LAYERS, A.NORM)),
        ParamInfo("layers/mlp/gate_proj", (n, d, f), (A.LAYERS, A.EMBED, A.MLP)),
        ParamInfo("layers/mlp/up_proj", (n, d, f), (A.LAYERS, A.EMBED, A.MLP)),
        ParamInfo("layers/mlp/down_proj", (n, f, d), (A.LAYERS, A.MLP, A.EMBED)),
        ParamInfo("final_norm/scale", (d,), (A.NORM,)),
    ]
    if not model.tie_embeddings:
        table.append(ParamInfo("lm_head/kernel", (d, v), (A.EMBED, A.VOCAB)))
    return tuple(table)


def param_count(model: ModelConfig) -> int:
    """Total parameters of `model`."""
    return sum(p.size for p in param_table(model))


LORA_WEIGHTS = {"q": ("layers/attn/q_proj", 1), "k": ("layers/attn/k_proj", 1),
                "v": ("layers/attn/v_proj", 1), "o": ("layers/attn/o_proj", 2),
                "gate": ("layers/mlp/gate_proj", 1), "up": ("layers/mlp/up_proj", 1),
                "down": ("layers/mlp/down_proj", 1)}
"""LoRA target -> (the stacked weight it adapts, how many per-layer dims its matmul contracts);
`locojax.model.lora` uses the same (a test checks)."""
assert tuple(LORA_WEIGHTS) == LORA_TARGETS


def adapter_table(model: ModelConfig, lora: LoraConfig) -> tuple[ParamInfo, ...]:
    """The LoRA adapters' parameters (A: layers x in... x r, B: layers x r x out...), in the
    order of `LORA_TARGETS`; empty at rank 0. Names: '<weight>/lora_a', '<weight>/lora_b'."""
    if lora.rank == 0:
        return ()
    weights = {p.name: p for p in param_table(model)}
    table = []
    for target in LORA_TARGETS:
        if target not in lora.targets:
            continue
        name, k = LORA_WEIGHTS[target]
        w = weights[name]
        ins, outs = slice(1, 1 + k), slice(1 + k, None)
        table += [
            ParamInfo(f"{name}/lora_a", (w.shape[0], *w.shape[ins], lora.rank),
                      (w.axes[0], *w.axes[ins], A.LORA_RANK)),
            ParamInfo(f"{name}/lora_b", (w.shape[0], lora.rank, *w.shape[outs]),
                      (w.axes[0], A.LORA_RANK, *w.axes[outs])),
        ]
    return tuple(table)

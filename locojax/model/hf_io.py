"""Hugging Face Qwen3 checkpoints <-> the runtime params state (safetensors, no torch).

Torch `Linear` weights are (out, in); ours are (in, ..., out) with heads split out, and
layers are stacked. Conversions are transposes and reshapes only, so a round trip is exact.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

from locojax.model.arch import ModelArch, arch_from_hf_config, hf_config_from_arch
from locojax.model.qwen3 import flat_params, params_from_flat

# Our stacked name -> HF per-layer suffix after "model.layers.{i}.".
_LAYER_NAMES = {
    "layers/attn_norm/scale": "input_layernorm.weight",
    "layers/attn/q_proj": "self_attn.q_proj.weight",
    "layers/attn/k_proj": "self_attn.k_proj.weight",
    "layers/attn/v_proj": "self_attn.v_proj.weight",
    "layers/attn/o_proj": "self_attn.o_proj.weight",
    "layers/attn/q_norm/scale": "self_attn.q_norm.weight",
    "layers/attn/k_norm/scale": "self_attn.k_norm.weight",
    "layers/mlp_norm/scale": "post_attention_layernorm.weight",
    "layers/mlp/gate_proj": "mlp.gate_proj.weight",
    "layers/mlp/up_proj": "mlp.up_proj.weight",
    "layers/mlp/down_proj": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "embed/embedding": "model.embed_tokens.weight",
    "final_norm/scale": "model.norm.weight",
    "lm_head/kernel": "lm_head.weight",
}


def _to_hf(name: str, ours: np.ndarray) -> np.ndarray:
    """One layer's (or a global) array in our layout -> torch layout."""
    if name.endswith(("q_proj", "k_proj", "v_proj")):  # (D, H, hd) -> (H*hd, D)
        return ours.reshape(ours.shape[0], -1).T
    if name.endswith("o_proj"):  # (H, hd, D) -> (D, H*hd)
        return ours.reshape(-1, ours.shape[-1]).T
    if name.endswith(("_proj", "lm_head/kernel")):  # (in, out) -> (out, in)
        return ours.T
    return ours


def _from_hf(name: str, theirs: np.ndarray, arch: ModelArch) -> np.ndarray:
    """One layer's (or a global) array in torch layout -> our layout."""
    hd = arch.head_dim
    if name.endswith(("q_proj", "k_proj", "v_proj")):
        return theirs.T.reshape(theirs.shape[1], -1, hd)
    if name.endswith("o_proj"):
        return theirs.T.reshape(-1, hd, theirs.shape[0])
    if name.endswith(("_proj", "lm_head/kernel")):
        return theirs.T
    return theirs


def _read_tensors(ckpt: Path) -> dict[str, np.ndarray]:
    """All tensors of `model.safetensors` or of the shards listed in its index."""
    single = ckpt / "model.safetensors"
    if single.exists():
        return load_file(single)
    index = ckpt / "model.safetensors.index.json"
    if not index.exists():
        raise FileNotFoundError(f"{ckpt}: neither model.safetensors nor its index")
    tensors: dict[str, np.ndarray] = {}
    for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        tensors.update(load_file(ckpt / shard))
    return tensors


def load_hf_checkpoint(
    ckpt_dir: str | Path, dtype: str | None = None
) -> tuple[ModelArch, nnx.State]:
    """(arch, params) from a Hugging Face Qwen3 directory; `dtype` casts (default: as stored)."""
    ckpt = Path(ckpt_dir)
    arch = arch_from_hf_config(json.loads((ckpt / "config.json").read_text()))
    tensors = _read_tensors(ckpt)
    stored = {str(t.dtype) for t in tensors.values()}
    if dtype is None and len(stored) == 1:
        dtype = stored.pop()  # config.json's torch_dtype may disagree with the tensors
    if dtype is not None:
        arch = dataclasses.replace(arch, dtype=dtype)
        tensors = {k: v.astype(arch.jnp_dtype, copy=False) for k, v in tensors.items()}
    if arch.tie_embeddings:
        tensors.pop("lm_head.weight", None)  # some exports store the tied copy too
    arrays: dict[str, np.ndarray] = {}
    for ours, theirs in _GLOBAL_NAMES.items():
        if theirs in tensors:
            arrays[ours] = _from_hf(ours, tensors.pop(theirs), arch)
    for ours, suffix in _LAYER_NAMES.items():
        names = [f"model.layers.{i}.{suffix}" for i in range(arch.num_layers)]
        if all(n in tensors for n in names):
            arrays[ours] = np.stack([_from_hf(ours, tensors.pop(n), arch) for n in names])
    if tensors:
        raise ValueError(f"{ckpt}: tensors not used by Qwen3: {sorted(tensors)[:8]}")
    return arch, params_from_flat(arch, arrays)


def export_hf_checkpoint(arch: ModelArch, params: nnx.State, out_dir: str | Path) -> Path:
    """Write config.json and model.safetensors that `Qwen3ForCausalLM.from_pretrained` loads."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    for ours, var in flat_params(params).items():
        value = np.asarray(var[...])
        if ours in _GLOBAL_NAMES:
            tensors[_GLOBAL_NAMES[ours]] = _to_hf(ours, value)
            continue
        for i in range(arch.num_layers):
            tensors[f"model.layers.{i}.{_LAYER_NAMES[ours]}"] = _to_hf(ours, value[i])
    dtypes = {str(t.dtype) for t in tensors.values()}
    if dtypes != {str(jnp.dtype(arch.jnp_dtype))}:
        raise ValueError(f"params have dtypes {sorted(dtypes)}, arch.dtype={arch.dtype!r}")
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config_from_arch(arch), indent=2) + "\n")
    return out

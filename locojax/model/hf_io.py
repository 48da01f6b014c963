"""Hugging Face Qwen3 checkpoints <-> the runtime params state (safetensors, no torch).

Torch `Linear` weights are (out, in); ours are (in, ..., out) with heads split out, and
layers are stacked. Conversions are transposes and reshapes only, so a round trip is exact.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from locojax.model.arch import ModelArch, arch_from_hf_config, hf_config_from_arch
from locojax.model.qwen3 import abstract_model, flat_params, params_from_flat

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


class CheckpointError(ValueError):
    """A Hugging Face checkpoint that cannot be loaded: one line naming the file and tensor."""


def _hf_shape(name: str, ours: tuple[int, ...]) -> tuple[int, ...]:
    """The torch-layout shape `_to_hf` gives an array of our shape `ours`."""
    if name.endswith(("q_proj", "k_proj", "v_proj")):  # (D, H, hd) -> (H*hd, D)
        return (int(np.prod(ours[1:])), ours[0])
    if name.endswith("o_proj"):  # (H, hd, D) -> (D, H*hd)
        return (ours[-1], int(np.prod(ours[:-1])))
    if name.endswith(("_proj", "lm_head/kernel")):
        return tuple(reversed(ours))
    return tuple(ours)


def expected_tensors(arch: ModelArch) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> torch-layout shape of every tensor a checkpoint of `arch` holds."""
    out = {}
    for ours, var in flat_params(abstract_model(arch)[1]).items():
        if ours in _GLOBAL_NAMES:
            out[_GLOBAL_NAMES[ours]] = _hf_shape(ours, var.shape)
        else:
            for i in range(arch.num_layers):
                out[f"model.layers.{i}.{_LAYER_NAMES[ours]}"] = _hf_shape(ours, var.shape[1:])
    return out


def _config(ckpt: Path) -> ModelArch:
    """The architecture in `config.json`, or a CheckpointError naming the file and the fault."""
    path = ckpt / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise CheckpointError(f"{path}: no such file") from err
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: cannot read it ({err})") from err
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: not JSON ({err})") from err
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    try:
        return arch_from_hf_config(config)
    except KeyError as err:
        raise CheckpointError(f"{path}: no {err.args[0]!r}") from err
    except (TypeError, ValueError, ZeroDivisionError) as err:
        raise CheckpointError(f"{path}: {err}") from err


def _files(ckpt: Path) -> list[Path]:
    """The safetensors files of the checkpoint: one file, or the shards its index lists."""
    single = ckpt / "model.safetensors"
    if single.exists():
        return [single]
    index = ckpt / "model.safetensors.index.json"
    if not index.exists():
        raise CheckpointError(f"{ckpt}: neither model.safetensors nor "
                              "model.safetensors.index.json")
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
            AttributeError) as err:
        raise CheckpointError(f"{index}: not a safetensors index with a weight_map ({err})") \
            from err
    for shard in shards:
        if not (ckpt / shard).is_file():
            raise CheckpointError(f"{index}: lists {shard}, which is missing")
    return [ckpt / shard for shard in shards]


def _shapes(files: list[Path]) -> dict[str, tuple[tuple[int, ...], Path]]:
    """Tensor name -> (shape, file), from the safetensors headers alone."""
    out: dict[str, tuple[tuple[int, ...], Path]] = {}
    for path in files:
        try:
            with safe_open(path, "numpy") as f:
                for name in f.keys():
                    out[name] = (tuple(f.get_slice(name).get_shape()), path)
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{path}: not a complete safetensors file ({err})") from err
    return out


def check_tensors(arch: ModelArch, shapes: dict[str, tuple[tuple[int, ...], Path]],
                  where: Path) -> None:
    """Every tensor `arch` needs is there with its shape, and no other: else a CheckpointError
    naming the first fault (file, tensor, expected and found shapes) and how many there are."""
    want = expected_tensors(arch)
    want_extra = {"lm_head.weight"} if arch.tie_embeddings else set()  # a stored tied copy
    faults = []
    for name, shape in want.items():
        if name not in shapes:
            faults.append(f"{where}: tensor {name} is missing (expected shape {shape})")
        elif shapes[name][0] != shape:
            faults.append(f"{shapes[name][1]}: tensor {name} has shape {shapes[name][0]}, "
                          f"expected {shape} from config.json")
    for name in sorted(set(shapes) - set(want) - want_extra):
        faults.append(f"{shapes[name][1]}: tensor {name} (shape {shapes[name][0]}) is not a "
                      f"Qwen3 tensor of this config.json ({arch.num_layers} layers)")
    if faults:
        more = f" (and {len(faults) - 1} more)" if len(faults) > 1 else ""
        raise CheckpointError(faults[0] + more)


def _read_tensors(ckpt: Path, arch: ModelArch) -> dict[str, np.ndarray]:
    """All tensors of the checkpoint, once their names and shapes match `arch`."""
    files = _files(ckpt)
    check_tensors(arch, _shapes(files), files[0] if len(files) == 1 else ckpt)
    tensors: dict[str, np.ndarray] = {}
    for path in files:
        try:
            tensors.update(load_file(path))
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{path}: not a complete safetensors file ({err})") from err
    for name, value in tensors.items():
        bad = int(value.size - np.isfinite(value).sum()) if value.dtype.kind == "f" else 0
        if bad:
            raise CheckpointError(f"{ckpt}: tensor {name} has {bad} non-finite values "
                                  f"(nan or inf) of {value.size}")
    return tensors


def load_hf_checkpoint(
    ckpt_dir: str | Path, dtype: str | None = None
) -> tuple[ModelArch, nnx.State]:
    """(arch, params) from a Hugging Face Qwen3 directory; `dtype` casts (default: as stored).

    A fault (config.json missing or not JSON, a tensor missing, extra, of the wrong shape,
    truncated, or not finite) is a `CheckpointError` naming the file and the tensor."""
    ckpt = Path(ckpt_dir)
    arch = _config(ckpt)
    tensors = _read_tensors(ckpt, arch)
    stored = {str(t.dtype) for t in tensors.values()}
    if dtype is None and len(stored) == 1:
        dtype = stored.pop()  # config.json's torch_dtype may disagree with the tensors
    if dtype is not None:
        arch = dataclasses.replace(arch, dtype=dtype)
        tensors = {k: v.astype(arch.jnp_dtype, copy=False) for k, v in tensors.items()}
    if arch.tie_embeddings:
        tensors.pop("lm_head.weight", None)
    arrays: dict[str, np.ndarray] = {}
    for ours, theirs in _GLOBAL_NAMES.items():
        if theirs in tensors:
            arrays[ours] = _from_hf(ours, tensors.pop(theirs), arch)
    for ours, suffix in _LAYER_NAMES.items():
        names = [f"model.layers.{i}.{suffix}" for i in range(arch.num_layers)]
        if all(n in tensors for n in names):
            arrays[ours] = np.stack([_from_hf(ours, tensors.pop(n), arch) for n in names])
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
    _write(out, tensors, json.dumps(hf_config_from_arch(arch), indent=2) + "\n")
    return out


def _write(out: Path, tensors: dict[str, np.ndarray], config: str) -> None:
    """Write both files atomically with ordinary permissions (0666 less the umask).

    safetensors writes through a `.tmp*` file in `out` and renames it (mode 0600); one an
    earlier export left when it was killed is removed first."""
    for stale in out.glob(".tmp*"):
        stale.unlink(missing_ok=True)
    umask = os.umask(0)
    os.umask(umask)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o666 & ~umask)
    partial = out / ".config.json.partial"
    partial.write_text(config)
    os.replace(partial, out / "config.json")

"""Hugging Face Qwen3, Qwen2, Llama, Gemma 3 and SmolLM3 checkpoints <-> the runtime params
state (safetensors, no torch). The families share HF's tensor names but for Gemma's norms
(`Family.layer_names`); a family's options decide which are there (q/k norms: Qwen3, Gemma 3;
q/k/v biases: Qwen2; post-attention and post-MLP norms: Gemma 3; lm_head: untied heads).

Torch `Linear` weights are (out, in); ours are (in, ..., out) with heads split out, and
layers are stacked. Conversions are transposes and reshapes only, so a round trip is exact.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from functools import partial
from pathlib import Path, PurePosixPath

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from locojax.model.arch import ModelArch, arch_from_hf_config, hf_config_from_arch
from locojax.model.qwen3 import abstract_model, flat_params, params_from_flat

# Our stacked name -> HF per-layer suffix after "model.layers.{i}.".
_LAYER_NAMES = {
    "layers/attn_norm/scale": "input_layernorm.weight",
    "layers/attn/q_proj": "self_attn.q_proj.weight",
    "layers/attn/k_proj": "self_attn.k_proj.weight",
    "layers/attn/v_proj": "self_attn.v_proj.weight",
    "layers/attn/o_proj": "self_attn.o_proj.weight",
    "layers/attn/q_bias": "self_attn.q_proj.bias",
    "layers/attn/k_bias": "self_attn.k_proj.bias",
    "layers/attn/v_bias": "self_attn.v_proj.bias",
    "layers/attn/q_norm/scale": "self_attn.q_norm.weight",
    "layers/attn/k_norm/scale": "self_attn.k_norm.weight",
    "layers/mlp_norm/scale": "post_attention_layernorm.weight",
    "layers/mlp/gate_proj": "mlp.gate_proj.weight",
    "layers/mlp/up_proj": "mlp.up_proj.weight",
    "layers/mlp/down_proj": "mlp.down_proj.weight",
}
def _layer_name(arch: ModelArch, ours: str) -> str:
    """HF per-layer suffix of our stacked parameter `ours` in `arch`'s family."""
    return dict(arch.options.layer_names).get(ours) or _LAYER_NAMES[ours]


_GLOBAL_NAMES = {
    "embed/embedding": "model.embed_tokens.weight",
    "final_norm/scale": "model.norm.weight",
    "lm_head/kernel": "lm_head.weight",
}


def _to_hf(name: str, ours: np.ndarray) -> np.ndarray:
    """One layer's (or a global) array in our layout -> torch layout."""
    if name.endswith("_bias"):  # (H, hd) -> (H*hd,)
        return ours.reshape(-1)
    if name.endswith(("q_proj", "k_proj", "v_proj")):  # (D, H, hd) -> (H*hd, D)
        return ours.reshape(ours.shape[0], -1).T
    if name.endswith("o_proj"):  # (H, hd, D) -> (D, H*hd)
        return ours.reshape(-1, ours.shape[-1]).T
    if name.endswith(("_proj", "lm_head/kernel")):  # (in, out) -> (out, in)
        return ours.T
    return ours


class _Layout:
    """How one of our arrays (layer axis removed) lies in its torch tensor."""

    SAME = "same"  # norms, the embedding: identical
    TRANSPOSED = "transposed"  # (in, out) <- (out, in)
    HEADS_IN = "heads_in"  # q/k/v: (D, H, hd) <- (H*hd, D)
    HEADS_OUT = "heads_out"  # o: (H, hd, D) <- (D, H*hd)
    HEADS_BIAS = "heads_bias"  # q/k/v bias: (H, hd) <- (H*hd,)


def _layout(name: str) -> str:
    if name.endswith("_bias"):
        return _Layout.HEADS_BIAS
    if name.endswith(("q_proj", "k_proj", "v_proj")):
        return _Layout.HEADS_IN
    if name.endswith("o_proj"):
        return _Layout.HEADS_OUT
    if name.endswith(("_proj", "lm_head/kernel")):
        return _Layout.TRANSPOSED
    return _Layout.SAME


class CheckpointError(ValueError):
    """A Hugging Face checkpoint that cannot be loaded: one line naming the file and tensor."""


def _hf_shape(name: str, ours: tuple[int, ...]) -> tuple[int, ...]:
    """The torch-layout shape `_to_hf` gives an array of our shape `ours`."""
    if name.endswith("_bias"):  # (H, hd) -> (H*hd,)
        return (int(np.prod(ours)),)
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
                out[f"model.layers.{i}.{_layer_name(arch, ours)}"] = _hf_shape(ours, var.shape[1:])
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
        # Lexically: a shard may be a symlink out of the directory (the Hub cache's blobs).
        if not isinstance(shard, str) or PurePosixPath(shard).is_absolute() or ".." in \
                PurePosixPath(shard).parts:
            raise CheckpointError(f"{index}: lists {shard!r}, which is not a file of {ckpt} "
                                  "(a shard is named relative to the checkpoint's directory)")
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
                      f"{arch.family} tensor of this config.json ({arch.num_layers} layers)")
    if faults:
        more = f" (and {len(faults) - 1} more)" if len(faults) > 1 else ""
        raise CheckpointError(faults[0] + more)


def _read_ours(read, layout: str, idx: tuple[slice, ...], hd: int) -> np.ndarray:
    """Elements `idx` (normalised slices) of one of our arrays, from `read(torch_idx)`.

    Head dimensions are read as whole heads (rows h0*hd .. h1*hd) and cut afterwards, so a
    shard reads only its own rows and columns of the torch tensor.
    """
    if layout == _Layout.HEADS_IN:
        d, h, e = idx
        x = read((slice(h.start * hd, h.stop * hd), d))
        return x.T.reshape(x.shape[1], -1, hd)[:, :, e]
    if layout == _Layout.HEADS_BIAS:
        h, e = idx
        return read((slice(h.start * hd, h.stop * hd),)).reshape(-1, hd)[:, e]
    if layout == _Layout.HEADS_OUT:
        h, e, d = idx
        x = read((d, slice(h.start * hd, h.stop * hd)))
        return x.T.reshape(-1, hd, x.shape[0])[:, e, :]
    if layout == _Layout.TRANSPOSED:
        return read(idx[::-1]).T
    return read(idx)


class _HfTensors:
    """The tensors of `model.safetensors` or of the shards its index lists, read by slices
    (headers are read at once: names, shapes and files)."""

    def __init__(self, ckpt: Path):
        files = _files(ckpt)
        self.ckpt, self.where = ckpt, files[0] if len(files) == 1 else ckpt
        self.shapes = _shapes(files)
        """Tensor name -> (torch shape, file)."""
        self._open: dict[Path, object] = {}

    def _slice(self, name: str):
        path = self.shapes[name][1]
        if path not in self._open:
            self._open[path] = safe_open(path, "numpy")
        return self._open[path].get_slice(name)

    def dtype(self, name: str) -> str:
        return _SAFETENSORS_DTYPES.get(self._slice(name).get_dtype(), "other")

    def check_dtypes(self, names: list[str]) -> None:
        """CheckpointError naming the first of `names` not stored in a floating-point dtype
        (its header read, none of its data)."""
        for name in names:
            stored = self._slice(name).get_dtype()
            if stored not in _FLOAT_STORED:
                raise CheckpointError(f"{self.shapes[name][1]}: tensor {name} is stored as "
                                      f"{stored}, not a floating-point dtype "
                                      f"({', '.join(_FLOAT_STORED)})")

    def read(self, name: str, idx: tuple[slice, ...]) -> np.ndarray:
        """Only the elements `idx` of tensor `name` (safetensors reads them from the file);
        a CheckpointError when they are cut short or not all finite."""
        try:
            value = np.asarray(self._slice(name)[idx])
        except (SafetensorError, OSError) as err:
            path = self.shapes[name][1]
            raise CheckpointError(f"{path}: not a complete safetensors file ({err})") from err
        bad = int(value.size - np.isfinite(value).sum()) if value.dtype.kind == "f" else 0
        if bad:
            raise CheckpointError(f"{self.ckpt}: tensor {name} has {bad} non-finite values "
                                  f"(nan or inf) of {value.size} read")
        return value


_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
_FLOAT_STORED = ("F32", "BF16", "F16", "F64")
"""safetensors dtypes a weight may be stored in (read, then cast)."""


class HfReader:
    """A Qwen3, Qwen2 or Llama checkpoint read into our parameter layout, any box of any parameter at a time.

    `read(name, idx)` gives elements `idx` of our parameter `name` (e.g. 'layers/attn/q_proj',
    idx a tuple of slices as `jax.make_array_from_callback` passes them), touching only the
    torch rows and columns those elements come from.
    """

    def __init__(self, ckpt_dir: str | Path, arch: ModelArch):
        self.ckpt, self.arch = Path(ckpt_dir), arch
        self._tensors = _HfTensors(self.ckpt)
        self.shapes = {name: var.shape for name, var in flat_params(abstract_model(arch)[1]).items()}
        check_tensors(arch, self._tensors.shapes, self._tensors.where)
        self._tensors.check_dtypes(sorted(expected_tensors(arch)))

    def _sources(self, name: str) -> list[str]:
        """The torch tensor(s) of our parameter `name`: one per layer for stacked ones."""
        if name in _GLOBAL_NAMES:
            return [_GLOBAL_NAMES[name]]
        return [f"model.layers.{i}.{_layer_name(self.arch, name)}"
                for i in range(self.arch.num_layers)]

    def stored_dtypes(self) -> set[str]:
        """dtypes the checkpoint's tensors are stored in."""
        return {self._tensors.dtype(src) for name in self.shapes for src in self._sources(name)}

    def read(self, name: str, idx: tuple[slice, ...] | None = None) -> np.ndarray:
        """Elements `idx` (default: all) of our parameter `name`, in the stored dtype."""
        shape = self.shapes[name]
        idx = tuple(slice(*s.indices(n)) for s, n in zip(idx or (slice(None),) * len(shape),
                                                        shape, strict=True))
        if any(s.step != 1 for s in idx):
            raise ValueError(f"{name}: strided reads {idx} are not supported")
        layout, hd = _layout(name), self.arch.head_dim
        if name in _GLOBAL_NAMES:
            return _read_ours(partial(self._tensors.read, _GLOBAL_NAMES[name]), layout, idx, hd)
        layers = range(idx[0].start, idx[0].stop)
        return np.stack([_read_ours(partial(self._tensors.read, self._sources(name)[i]), layout,
                                    idx[1:], hd) for i in layers])


def load_hf_checkpoint(
    ckpt_dir: str | Path, dtype: str | None = None
) -> tuple[ModelArch, nnx.State]:
    """(arch, params) from a Hugging Face Qwen3, Qwen2 or Llama directory; `dtype` casts (default: as stored).

    A fault (config.json missing or not JSON, a tensor missing, extra, of the wrong shape,
    truncated, or not finite) is a `CheckpointError` naming the file and the tensor."""
    ckpt = Path(ckpt_dir)
    arch = _config(ckpt)
    reader = HfReader(ckpt, arch)
    stored = reader.stored_dtypes()
    if dtype is None and len(stored) == 1:
        dtype = stored.pop()  # config.json's torch_dtype may disagree with the tensors
    if dtype is not None:
        arch = dataclasses.replace(arch, dtype=dtype)
    arrays = {name: reader.read(name).astype(arch.jnp_dtype, copy=False) for name in reader.shapes}
    return arch, params_from_flat(arch, arrays)


def load_hf_params(ckpt_dir: str | Path, arch: ModelArch, shardings: nnx.State,
                   dtype: str) -> nnx.State:
    """The checkpoint's weights as `dtype` arrays placed straight onto `shardings`.

    Every process reads only the boxes its own devices hold (a box that several local
    devices share, e.g. replicated along the data axis, is read once). `arch` must be the
    checkpoint's architecture (the compiler checked it against config.json); shapes are
    checked against the tensors before any is read.
    """
    reader = HfReader(ckpt_dir, arch)
    target = jnp.dtype(dtype)

    def place(name: str, sharding) -> jax.Array:
        boxes: dict[tuple, np.ndarray] = {}

        def box(idx):
            key = tuple((s.start, s.stop) for s in idx)
            if key not in boxes:
                boxes[key] = reader.read(name, idx).astype(target, copy=False)
            return boxes[key]

        return jax.make_array_from_callback(reader.shapes[name], sharding, box)

    flat = {name: var.get_value() for name, var in flat_params(shardings).items()}
    return params_from_flat(arch, {name: place(name, sh) for name, sh in flat.items()})


def export_hf_checkpoint(arch: ModelArch, params: nnx.State | Mapping[str, np.ndarray],
                         out_dir: str | Path) -> Path:
    """Write config.json and model.safetensors that `arch`'s family's `*ForCausalLM`
    (`Qwen3ForCausalLM`, `Qwen2ForCausalLM`, `LlamaForCausalLM`) `from_pretrained` loads.

    `params`: the params state, or its arrays keyed by '/'-joined path (e.g. a host copy).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    arrays = ({name: var[...] for name, var in flat_params(params).items()}
              if isinstance(params, nnx.State) else params)
    for ours, value in arrays.items():
        value = np.asarray(value)
        if ours in _GLOBAL_NAMES:
            tensors[_GLOBAL_NAMES[ours]] = _to_hf(ours, value)
            continue
        for i in range(arch.num_layers):
            tensors[f"model.layers.{i}.{_layer_name(arch, ours)}"] = _to_hf(ours, value[i])
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

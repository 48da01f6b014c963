"""Low-rank adapters (LoRA) on the decoder blocks' matmuls: W = W_base + (alpha / r) A B.

    LoraSpec(rank, alpha, targets)                  which matmuls, rank and scale
    init_adapters(arch, spec, key) -> {path: {'a': A, 'b': B}}   A ~ N(0, 1/fan_in), B = 0
    with_adapters(base, adapters, spec) -> params   the base with each target weight a
                                                    `LoraWeight` (the model multiplies it
                                                    unmerged: x W + s (x A) B)
    merged(base, adapters, spec, dtype) -> params   plain weights W + s A B in `dtype` (the
                                                    rollout copy; computed in fp32, cast once)
    adapter_flat(adapters) -> {'layers/attn/q_proj/lora_a': A, ...}   and back: adapters_from_flat

Shapes: a target weight stacked over layers is N x in... x out... (`in` the dims the matmul
contracts, `layers.MATMUL_WEIGHTS`); its A is N x in... x r and its B is N x r x out..., so
tensordot(A, B, 1) has the weight's shape and x A contracts exactly like x W. B starts at
zero, so the adapted model equals the base until the first update changes B.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from math import prod

import jax
import jax.numpy as jnp
from flax import nnx

from locojax.model.arch import ModelArch
from locojax.model.layers import MATMUL_WEIGHTS, fan_in_normals
from locojax.model.qwen3 import abstract_model, flat_params

TARGET_PATHS = {
    "q": "layers/attn/q_proj", "k": "layers/attn/k_proj", "v": "layers/attn/v_proj",
    "o": "layers/attn/o_proj", "gate": "layers/mlp/gate_proj", "up": "layers/mlp/up_proj",
    "down": "layers/mlp/down_proj",
}
"""`algorithm.lora.targets` name -> the stacked parameter it adapts."""


@dataclass(frozen=True)
class LoraSpec:
    """Which block matmuls carry adapters, their rank and scale (`algorithm.lora`)."""

    rank: int
    """Adapter rank r >= 1."""
    alpha: float
    """The update is (alpha / rank) A B."""
    targets: tuple[str, ...] = tuple(TARGET_PATHS)
    """Keys of `TARGET_PATHS`."""

    def __post_init__(self):
        if self.rank < 1 or not self.alpha > 0:
            raise ValueError(f"LoRA rank={self.rank} must be >= 1 and alpha={self.alpha} > 0")
        unknown = set(self.targets) - set(TARGET_PATHS)
        if unknown or not self.targets:
            raise ValueError(f"LoRA targets {self.targets}: expected some of {tuple(TARGET_PATHS)}")
        object.__setattr__(self, "targets", tuple(self.targets))

    @property
    def scale(self) -> float:
        """alpha / rank."""
        return self.alpha / self.rank

    @property
    def paths(self) -> tuple[str, ...]:
        """The adapted parameters' paths, in `TARGET_PATHS` order."""
        return tuple(p for t, p in TARGET_PATHS.items() if t in self.targets)


def contracted(path: str) -> int:
    """How many leading (per-layer) dims of the weight at `path` its matmul contracts."""
    return MATMUL_WEIGHTS[path.rsplit("/", 1)[1]]


@partial(jax.tree_util.register_dataclass, data_fields=("w", "a", "b"),
         meta_fields=("scale",))
@dataclass(frozen=True)
class LoraWeight:
    """A base weight and its adapters, multiplied unmerged (`ops.tensordot` calls `contract`).

    A pytree whose children are the arrays, so casts, scans over layers, remat and gradients
    pass through it; `scale` is static."""

    w: jax.Array
    a: jax.Array
    b: jax.Array
    scale: float

    def contract(self, x: jax.Array, axes: int) -> jax.Array:
        """x W + scale (x A) B, contracting x's last `axes` dims."""
        # The barrier keeps XLA from fusing the add into the base product (CPU then emits a
        # dot that rounds differently): x W is the very program the base model runs, so with
        # B = 0 the output is the base model's bit for bit.
        base = jax.lax.optimization_barrier(jnp.tensordot(x, self.w, axes))
        low = jnp.tensordot(jnp.tensordot(x, self.a, axes), self.b, 1)
        return base + (self.scale * low).astype(base.dtype)


def _shapes(arch: ModelArch, spec: LoraSpec) -> dict[str, tuple[tuple, tuple, int]]:
    """path -> (A's shape, B's shape, A's fan-in) from the model's parameter shapes."""
    flat = flat_params(abstract_model(arch)[1])
    out = {}
    for path in spec.paths:
        shape, k = flat[path].shape, contracted(path)
        n, ins, outs = shape[0], shape[1:1 + k], shape[1 + k:]
        fan_in = prod(ins)
        out[path] = ((n, *ins, spec.rank), (n, spec.rank, *outs), fan_in)
    return out


def init_adapters(arch: ModelArch, spec: LoraSpec, key: jax.Array) -> dict:
    """{path: {'a': A, 'b': B}} in `arch.param_dtype`: A ~ N(0, 1/fan_in), B = 0."""
    dtype = arch.jnp_param_dtype
    shapes = _shapes(arch, spec)
    keys = jax.random.split(key, len(shapes))
    out = {}
    for k, (path, (a_shape, b_shape, fan_in)) in zip(keys, shapes.items(), strict=True):
        (a,) = fan_in_normals(k, ((a_shape, fan_in),), dtype)
        out[path] = {"a": a, "b": jnp.zeros(b_shape, dtype)}
    return out


def abstract_adapters(arch: ModelArch, spec: LoraSpec) -> dict:
    """The adapters as ShapeDtypeStructs (allocates nothing)."""
    dtype = arch.jnp_param_dtype
    return {path: {"a": jax.ShapeDtypeStruct(a, dtype), "b": jax.ShapeDtypeStruct(b, dtype)}
            for path, (a, b, _) in _shapes(arch, spec).items()}


def _replace(base: nnx.State, values: dict) -> nnx.State:
    """`base` with the Params at `values`' paths holding `values`' entries."""
    flat = nnx.to_flat_state(base)
    out = [(path, var.replace(values[key]) if (key := "/".join(map(str, path))) in values
            else var) for path, var in flat]
    return nnx.from_flat_state(out)


def with_adapters(base: nnx.State, adapters: dict, spec: LoraSpec) -> nnx.State:
    """The params the model runs with: each adapted weight a `LoraWeight` (traceable)."""
    flat = {"/".join(map(str, p)): v for p, v in nnx.to_flat_state(base)}
    return _replace(base, {path: LoraWeight(flat[path][...], ad["a"], ad["b"], spec.scale)
                           for path, ad in adapters.items()})


def delta(a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    """scale A B in fp32 for stacked adapters (N x in... x r, N x r x out...)."""
    ab = jax.vmap(lambda x, y: jnp.tensordot(x, y, 1))(a.astype(jnp.float32),
                                                     b.astype(jnp.float32))
    return scale * ab


def merged(base: nnx.State, adapters: dict, spec: LoraSpec, dtype) -> nnx.State:
    """Plain params W + scale A B in `dtype` (every other weight cast to `dtype` too)."""
    flat = {"/".join(map(str, p)): v for p, v in nnx.to_flat_state(base)}
    values = {path: (flat[path][...].astype(jnp.float32)
                     + delta(ad["a"], ad["b"], spec.scale)).astype(dtype)
              for path, ad in adapters.items()}
    values.update({path: var[...].astype(dtype) for path, var in flat.items()
                   if path not in values})
    return _replace(base, values)


def adapter_flat(adapters: dict) -> dict[str, jax.Array]:
    """'{path}/lora_a' and '{path}/lora_b' -> array (the DA transfer's and export's names)."""
    return {f"{path}/lora_{k}": x for path, ad in adapters.items() for k, x in ad.items()}


def adapters_from_flat(flat: dict) -> dict:
    """Inverse of `adapter_flat`."""
    out: dict[str, dict] = {}
    for name, x in flat.items():
        path, kind = name.rsplit("/lora_", 1)
        out.setdefault(path, {})[kind] = x
    return out

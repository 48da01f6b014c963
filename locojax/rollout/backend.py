"""The rollout engine's compute backend: XLA's ops, or the CPU kernels (`locojax.kernels`).

    choose(mode, params, mesh) -> Backend    mode: auto | on | off (`KernelSwitch`); auto logs
                                             once which backend runs and why
    backend.ops                              the `ModelOps` handed to the model
    backend.prepare_layer(layer_state)       its weights in the backend's layout (once per
                                             generation, before the decode loop)
    backend.output_matrix(model)             the DxV output matrix in that layout
    backend.logits(hidden_BxD, w)            fp32 logits through it

The CPU kernels run where they apply: every parameter on one CPU device, rows not sharded,
fp32 weights, the kernels built (`locojax.kernels.cpu.available()`); `auto` also needs a CPU
with AVX-512 (`cpu.register_tiles_fit`: the narrower tile is not measured to beat XLA's ops).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from compiler.axes import MeshAxis
from compiler.vocab import KernelSwitch
from locojax.kernels import cpu, tpu_decode
from locojax.model.layers import MATMUL_WEIGHTS
from locojax.model.ops import ModelOps, cached_masked_attention, tensordot

log = logging.getLogger(__name__)


class KernelsUnavailable(ValueError):
    """`cpu_kernels=on` where the CPU kernels do not apply (the message says why)."""


def _cpu_matmul(x: jax.Array, w: Any, axes: int) -> jax.Array:
    """The panel matmul for packed weights, XLA's dot for any left unpacked."""
    if isinstance(w, cpu.Panels):
        return cpu.panel_matmul(x.reshape(*x.shape[:x.ndim - axes], -1), w)
    return tensordot(x, w, axes)


def _cpu_cached_attention(q_BxLxHxhd, keys, values_BxKxSxhd, mask_BxLxS, *,
                          keys_transposed: bool) -> jax.Array:
    """The decode-attention kernel on one-token steps over a `LayerKVCache`, else XLA's."""
    b, length, h, hd = q_BxLxHxhd.shape
    if not keys_transposed or length != 1:
        return cached_masked_attention(q_BxLxHxhd, keys, values_BxKxSxhd, mask_BxLxS,
                                       keys_transposed=keys_transposed)
    k = keys.shape[1]
    ctx_BxKxGxhd = cpu.decode_attention(q_BxLxHxhd.reshape(b, k, h // k, hd), keys,
                                        values_BxKxSxhd, mask_BxLxS[:, 0], hd**-0.5)
    return ctx_BxKxGxhd.reshape(b, 1, h, hd).astype(q_BxLxHxhd.dtype)


def _no_prepare(w: jax.Array, axes: int, transposed: bool) -> jax.Array:
    return w.T if transposed else w


def _pack(w: jax.Array, axes: int, transposed: bool) -> Any:
    """Panels of `w` viewed as a matrix (its first `axes` dims by the rest), if it packs."""
    if transposed:
        return cpu.pack_panels(w, True) if cpu.packable(w, True) else w.T
    w_KxN = w.reshape(math.prod(w.shape[:axes]), -1)
    if not cpu.packable(w_KxN):
        return w
    return cpu.pack_panels(w_KxN, out_shape=w.shape[axes:])


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class TiedTable:
    """A tied embedding used as the output matrix as it is stored (VxD), without a copy."""

    table_VxD: jax.Array


def _xla_logits(hidden_BxD: jax.Array, w) -> jax.Array:
    if isinstance(w, TiedTable):
        return jnp.einsum("bd,vd->bv", hidden_BxD, w.table_VxD,
                          preferred_element_type=jnp.float32)
    return jnp.dot(hidden_BxD, w, preferred_element_type=jnp.float32)


def _cpu_logits(hidden_BxD: jax.Array, w: Any) -> jax.Array:
    return cpu.panel_matmul(hidden_BxD, w) if isinstance(w, cpu.Panels) else _xla_logits(
        hidden_BxD, w)


@dataclass(frozen=True)
class Backend:
    """How the engine's program multiplies and attends; hashable (a static jit argument)."""

    name: str
    ops: ModelOps
    prepare: Callable[[jax.Array, int, bool], Any]
    """(w, axes, transposed) -> the weight in this backend's layout."""
    logits_fn: Callable[[jax.Array, Any], jax.Array]

    def prepare_layer(self, layer: nnx.State) -> nnx.State:
        """A layer's state with its matmul weights (`MATMUL_WEIGHTS`) prepared."""
        if self.prepare is _no_prepare:
            return layer

        def one(path, x):
            names = [getattr(k, "key", None) for k in path]
            axes = next((MATMUL_WEIGHTS[n] for n in names if n in MATMUL_WEIGHTS), None)
            return x if axes is None else self.prepare(x, axes, False)

        return jax.tree_util.tree_map_with_path(one, layer)

    def output_matrix(self, model, copy: bool = True) -> Any:
        """The output projection DxV prepared: a tied embedding VxD transposed once (XLA:CPU's
        dot reads a DxV matrix faster), or with `copy` False read as stored (XLA only)."""
        if model.lm_head is None:
            if not copy and self.prepare is _no_prepare:
                return TiedTable(model.embed.embedding[...])
            return self.prepare(model.embed.embedding[...], 1, True)
        return self.prepare(model.lm_head.kernel[...], 1, False)

    def logits(self, hidden_BxD: jax.Array, w: Any) -> jax.Array:
        """fp32 logits BxV of final-normed hidden states."""
        return self.logits_fn(hidden_BxD, w)


def _xla_cached_attention(q_BxLxHxhd, keys, values_BxKxSxhd, mask_BxLxS, *,
                          keys_transposed: bool) -> jax.Array:
    """XLA's cached attention, reading the cache through an optimization barrier.

    Without it, when a device holds one kv head (tensor-parallel rollout), XLA fuses the
    cache write into two consumers (the loop carry and the attention's squeezed view) and
    keeps a copy of the whole cache for each, every step.
    """
    keys, values_BxKxSxhd = jax.lax.optimization_barrier((keys, values_BxKxSxhd))
    return cached_masked_attention(q_BxLxHxhd, keys, values_BxKxSxhd, mask_BxLxS,
                                   keys_transposed=keys_transposed)


def _dense_live_mask(end, live_B, cols: int) -> jax.Array:
    """Bx1xS: slot j is read by row b iff it lies in the `live_B[b]` slots ending at `end`."""
    back_S = (end % cols - jnp.arange(cols, dtype=jnp.int32)) % cols
    return (back_S[None, :] < live_B[:, None])[:, None]


def tpu_stacked_attention(q_BxLxHxhd, k_all, v_all, layer, end, live_B, *,
                          interpret: bool = False) -> jax.Array:
    """The TPU decode kernel (`locojax.kernels.tpu_decode`; `interpret`: Pallas's interpreter,
    for a CPU) on one-token steps over cache widths it tiles, else the layer sliced out for
    XLA's attention under the same mask."""
    b, length, h, hd = q_BxLxHxhd.shape
    heads, cols = k_all.shape[2], k_all.shape[3]
    if length == 1 and cols % tpu_decode.LANES == 0:
        ctx = tpu_decode.ragged_decode_attention(
            q_BxLxHxhd.reshape(b, heads, h // heads, hd), k_all, v_all.astype(k_all.dtype),
            layer, end, live_B, block=tpu_decode.block_for(cols), interpret=interpret)
        return ctx.reshape(b, 1, h, hd)
    keys, values = (jax.lax.dynamic_index_in_dim(x, layer, keepdims=False)
                    for x in (k_all, v_all))
    return _xla_cached_attention(q_BxLxHxhd, keys, values, _dense_live_mask(end, live_B, cols),
                                 keys_transposed=False)


TPU_HEAD_LANES = 128
"""Head widths the TPU decode kernel reads in place: multiples of a vector register's lanes."""
XLA = Backend("xla", ModelOps(cached_attention=_xla_cached_attention), _no_prepare, _xla_logits)
TPU_KERNELS = Backend("tpu kernels", ModelOps(cached_attention=_xla_cached_attention,
                                              stacked_attention=tpu_stacked_attention),
                      _no_prepare, _xla_logits)
CPU_KERNELS = Backend("cpu kernels", ModelOps(matmul=_cpu_matmul,
                                              cached_attention=_cpu_cached_attention),
                      _pack, _cpu_logits)


def cpu_kernels_unusable(params: nnx.State, mesh: Mesh | None,
                         stacked: bool = False) -> str | None:
    """Why the CPU kernels cannot run this generation, or None when they can."""
    if stacked:
        return "the layers run scanned over stacked weights (stacked_layers)"
    leaves = jax.tree.leaves(params)
    devices = {d for x in leaves if isinstance(x, jax.Array) for d in x.devices()}
    if mesh is not None and mesh.devices.size != 1:
        return f"rows are sharded over {mesh.devices.size} devices"
    if len(devices) > 1:
        return f"parameters live on {len(devices)} devices"
    if any(d.platform != "cpu" for d in devices):
        return "parameters are not on a CPU"
    if not all(x.dtype == jnp.float32 for x in leaves):
        return "parameters are not all float32"
    return cpu.unavailable_reason()


def tpu_kernels_unusable(params: nnx.State, mesh: Mesh | None, stacked: bool,
                         head_dim: int = TPU_HEAD_LANES) -> str | None:
    """Why the TPU decode kernel cannot run this generation, or None when it can: stacked
    layers on TPU devices, one device per replica (a Pallas call is not split by XLA), heads
    of a multiple of `TPU_HEAD_LANES` (narrower ones made the TPU compiler re-lay every
    slot's caches: docs/models.md)."""
    devices = {d for x in jax.tree.leaves(params) if isinstance(x, jax.Array)
               for d in x.devices()}
    if mesh is not None:
        devices = set(mesh.devices.flat)
    if not devices or any(d.platform != "tpu" for d in devices):
        return "not on TPU devices"
    if not stacked:
        return "the layers run unrolled over per-layer caches"
    if mesh is not None and mesh.devices.size != mesh.shape.get(MeshAxis.REPLICA, 1):
        return "a replica spans several devices"
    if head_dim % TPU_HEAD_LANES:
        return f"head_dim {head_dim} is not a multiple of {TPU_HEAD_LANES}"
    return None


def choose(mode: KernelSwitch | str, params: nnx.State, mesh: Mesh | None,
           stacked: bool = False, tpu: KernelSwitch | str = KernelSwitch.auto,
           head_dim: int = TPU_HEAD_LANES) -> Backend:
    """The backend for `mode` (the CPU kernels) and `tpu` (the TPU decode kernel, tried
    first); `on` raises ValueError with the reason where the kernels do not apply, `auto`
    also keeps XLA's ops where they would run slower (no AVX-512: `cpu.register_tiles_fit`)
    and logs its choice and reason once per distinct choice."""
    tpu = KernelSwitch(tpu)
    if tpu != KernelSwitch.off:
        why = tpu_kernels_unusable(params, mesh, stacked, head_dim)
        if why is None:
            return TPU_KERNELS
        if tpu == KernelSwitch.on:
            raise KernelsUnavailable(f"the TPU kernels do not apply: {why}")
    mode = KernelSwitch(mode)
    if mode == KernelSwitch.off:
        return XLA
    why = cpu_kernels_unusable(params, mesh, stacked)
    if why is not None and mode == KernelSwitch.on:
        raise KernelsUnavailable(f"the CPU kernels do not apply: {why}")
    if mode == KernelSwitch.auto:
        why = why or cpu.register_tiles_fit()  # they run here, but slower than XLA's ops
        _log_choice(why)
    return XLA if why is not None else CPU_KERNELS


@functools.cache
def _log_choice(why: str | None) -> None:
    if why is None:
        log.info("rollout: CPU kernels (panel matmul, decode attention): one CPU device, fp32 "
                 "weights")
    else:
        log.info("rollout: XLA's ops, not the CPU kernels: %s", why)

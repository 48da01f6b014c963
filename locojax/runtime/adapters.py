"""The LoRA side of the trainer's state: frozen base, adapters, their fingerprint and merges.

    base_params(host) -> base          the start weights in the compute dtype (frozen; also
                                       the KL reference: no second copy)
    fresh_adapters(host) -> adapters   A from run.seed, B = 0, on model.adapter_shardings
    fingerprint(base) -> str           what a checkpoint records of the base it trained on
    check_base(meta, base, directory)  ResumeRefused when a checkpoint's base differs
    merged_params(model, base, adapters, dtype) -> params   W + (alpha / r) A B in `dtype` on
                                       the training shardings (CO's rollout copy, the export;
                                       a DA rollout host merges the adapters it received)
    abstract_adapters_on(model) -> adapters as ShapeDtypeStructs (restore targets)
"""

from __future__ import annotations

import hashlib
import json
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp

from locojax.model import load_hf_checkpoint
from locojax.model.lora import LoraSpec, abstract_adapters, merged
from locojax.runtime.components import Host, ModelLayout
from locojax.runtime.errors import ResumeRefused
from locojax.runtime.rundir.checkpoint import flatten_named
from locojax.runtime.weights import initial_params
from locojax.train.lora import init_adapter_state


def base_params(host: Host):
    """The frozen base: `model.checkpoint` or the seed's init, in the compute dtype (on the
    training shardings; a DA rollout host, which has none, reads it whole)."""
    if host.model.param_shardings is None and host.model.checkpoint is not None:
        return load_hf_checkpoint(host.model.checkpoint, dtype=host.model.compute_dtype)[1]
    return initial_params(host, host.model.compute_dtype)


def fresh_adapters(host: Host):
    """New adapters (B = 0: the first policy is the base)."""
    model = host.model
    return init_adapter_state(model.arch, model.lora, host.plan.run.seed,
                              model.adapter_shardings)


def _mixed_sum(x: jax.Array) -> jax.Array:
    """Sum over the leaf of a 32-bit mix (murmur3's finaliser) of each value's bits and its
    index: integer arithmetic mod 2^32, so any sharding gives the same number, and a change
    that a plain weighted sum can miss (every value doubled) changes it."""
    if x.dtype.itemsize == 2:
        words = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    else:
        words = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    h = words.reshape(-1) ^ (jax.lax.iota(jnp.uint32, words.size) * jnp.uint32(0x9E3779B1))
    h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
    return jnp.sum(h ^ (h >> 16), dtype=jnp.uint32)


_mixed_sums = jax.jit(lambda flat: {k: _mixed_sum(v) for k, v in flat.items()})


def fingerprint(base) -> str:
    """A short hash of every base leaf's mixed bit sum (the same on every host)."""
    flat = flatten_named(base)[0]
    sums = {k: int(v) for k, v in jax.device_get(_mixed_sums(flat)).items()}
    return hashlib.sha256(json.dumps(sorted(sums.items())).encode()).hexdigest()[:16]


BASE_FINGERPRINT = "base_fingerprint"
"""Checkpoint meta key (LoRA): `fingerprint` of the base the adapters were trained on."""


def check_base(meta: dict, base, directory: Path) -> None:
    """A LoRA checkpoint's adapters belong to the base they were trained on (one line)."""
    saved = meta.get(BASE_FINGERPRINT)
    if saved is not None and saved != (now := fingerprint(base)):
        raise ResumeRefused(f"{directory}: the saved adapters were trained on another base "
                            f"(fingerprint {saved}; model.checkpoint now gives {now}): resume "
                            "with that base or start a new run directory")


def abstract_adapters_on(model: ModelLayout):
    """The adapters as shape/dtype/sharding structs (allocates nothing)."""
    return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                        abstract_adapters(model.arch, model.lora), model.adapter_shardings)


@partial(jax.jit, static_argnums=(2, 3))
def _merge(base, adapters, spec: LoraSpec, dtype):
    return merged(base, adapters, spec, dtype)


def merged_params(model: ModelLayout, base, adapters, dtype: str):
    """base + (alpha / r) B A (our layout: A B) in `dtype`, laid out like the base."""
    out = _merge(base, adapters, model.lora, jnp.dtype(dtype))
    if model.param_shardings is None:  # a DA rollout host: the caller places them
        return out
    return jax.device_put(out, model.param_shardings)  # a no-op where XLA kept the base's

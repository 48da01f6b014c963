"""LoRA training: the adapters are the trained parameters, the base a frozen step argument.

    lora_split(spec, frozen_shardings) -> ParamSplit     for make_train_step / make_sft_step /
                                                         make_rescore_fn (`split=`)
    adapter_shardings(mesh, adapters) -> shardings       adapters whole on every device
    init_adapter_state(arch, spec, seed, shardings) -> adapters (B = 0, so the first policy
                                                       is the base exactly)

The adapters (and so their gradients and AdamW moments) are in the model's `param_dtype`;
the base is whatever the caller passes (the trainer: `model.dtype`, on the training
shardings), multiplied unmerged inside the step (`locojax.model.lora.LoraWeight`). Adapters
are replicated: they are small (r (in + out) per layer and target), so their gradient is one
all-reduce and they need no gather before a forward.
"""

from __future__ import annotations

from functools import partial

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from locojax.model.arch import ModelArch
from locojax.model.lora import LoraSpec, init_adapters, with_adapters
from locojax.train.step import ParamSplit

ADAPTER_SEED_OFFSET = 7_919
"""The adapters' A is drawn from run.seed + this (the base's init uses run.seed itself)."""


def _combine(spec: LoraSpec, base, adapters):
    return with_adapters(base, adapters, spec)


def lora_split(spec: LoraSpec, frozen_shardings=None) -> ParamSplit:
    """Train `spec`'s adapters over a frozen base (`frozen_shardings`: the base's layout)."""
    return ParamSplit(combine=partial(_combine, spec), frozen_shardings=frozen_shardings)


def adapter_shardings(mesh: Mesh, adapters):
    """Every adapter whole on every device of `mesh`."""
    return jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), adapters)


def init_adapter_state(arch: ModelArch, spec: LoraSpec, seed: int, shardings=None):
    """Fresh adapters from `seed` (A random, B zero), laid out on `shardings` when given."""
    def init():
        return init_adapters(arch, spec, jax.random.key(seed + ADAPTER_SEED_OFFSET))

    return jax.jit(init, out_shardings=shardings)()

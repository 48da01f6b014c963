"""What the trainer trains: the whole model (`FullParams`) or LoRA adapters on a frozen base
(`LoraParams`). The trainer and the step builders ask the split; none tests for LoRA itself.

    trained(host) -> FullParams | LoraParams           by algorithm.lora.rank
    split.abstract() / abstract_frozen()     the trained params / the steps' trailing
                                             arguments as structs: () | (base,)
    split.shardings                          layout of the trained params (and their
                                             moments): the weights' | the adapters'
    split.step_split()                       the steps' `ParamSplit`: None | the adapters'
    split.warms_base                         LoRA with a whole-model warm-up: the warm-up
                                             trains the model, which is then the base
                                             (`set_base`)
    split.attach(meta, directory)            at start: LoRA reads its base (model.checkpoint
                                             | the seed's init, compute dtype) and checks it
                                             against a restored step's meta (if any)
    split.resumed(meta, directory, restore)  on resume: a warmed base restored and checked
    split.fresh()                            the first trained params: the start weights in
                                             the master dtype | A from run.seed, B = 0
    split.frozen                             the steps' trailing arguments: () | (base,)
    split.new_reference(params, save)        the KL reference: a saved compute-dtype copy of
                                             `params` | the base (no second copy)
    split.restored_reference(restore)        on resume: the saved copy | the base
    split.meta()                             a checkpoint's extra meta: {} | the base's
                                             fingerprint
    split.policy(params, dtype)              plain weights: `params` | base + s A B in `dtype`
    split.host_copy(params)                  numpy in the compute dtype: the weights | the
                                             adapters only (DA's transfer)
    split.transfer_shapes()                  {name: abstract} of what that copy holds
    split.from_transfer(flat)                a DA rollout host's weights from a received copy:
                                             the weights | base + s A B (its base read by
                                             `attach`)
    split.export(params, out)                after the HF export: nothing | the adapters in
                                             PEFT's layout under out/lora
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from compiler.config import LoraWarmup
from compiler.sections import AlgorithmConfig
from locojax.model import abstract_model, flat_params, params_from_flat
from locojax.model.lora import abstract_adapters, adapter_flat, adapters_from_flat
from locojax.model.peft_io import export_peft_adapters
from locojax.runtime.adapters import (
    BASE_FINGERPRINT,
    abstract_adapters_on,
    base_params,
    check_base,
    fingerprint,
    fresh_adapters,
    merged_params,
)
from locojax.runtime.components import Host, ModelLayout
from locojax.runtime.weights import cast, host_copy, initial_params
from locojax.train.lora import lora_split

PEFT_DIR = "lora"
"""Subdirectory of the HF export holding the LoRA adapters (`PeftModel.from_pretrained`)."""


def warms_base_of(algorithm: AlgorithmConfig) -> bool:
    """LoRA with a whole-model warm-up (`algorithm.lora.warmup=full`): the warm-up trains the
    model, which then is the frozen base."""
    return (algorithm.lora.rank > 0 and algorithm.sft_warmup_steps > 0
            and algorithm.lora.warmup == LoraWarmup.full)


def params_structs(params, dtype: str, shardings):
    """`params` (arrays or structs) as `dtype` shape/dtype/sharding structs laid out by
    `shardings`, a tree of the same structure (allocates nothing)."""
    return jax.tree.map(lambda x, sharding: jax.ShapeDtypeStruct(x.shape, dtype,
                                                                 sharding=sharding),
                        params, shardings)


def abstract_params(model: ModelLayout, dtype: str):
    """The model's parameters as `dtype` structs on the training layout (allocates nothing)."""
    return params_structs(abstract_model(model.arch)[1], dtype, model.param_shardings)


class FullParams:
    """Full fine-tuning: the trained params are the model's master weights."""

    warms_base = False
    base = None
    frozen: tuple = ()

    def __init__(self, host: Host):
        self.host = host

    @property
    def shardings(self) -> Any:
        return self.host.model.param_shardings

    def abstract(self):
        return abstract_params(self.host.model, self.host.model.param_dtype)

    def abstract_frozen(self) -> tuple:
        return ()

    def step_split(self):
        return None

    def attach(self, meta: dict | None = None, directory: Path | None = None) -> None:
        pass

    def resumed(self, meta: dict, directory: Path, restore: Callable[[], Any]) -> None:
        pass

    def fresh(self):
        return initial_params(self.host)

    def new_reference(self, params, save: Callable[[Any], None]):
        reference = cast(params, self.host.model.compute_dtype)
        save(reference)
        return reference

    def restored_reference(self, restore: Callable[[], Any]):
        return restore()

    def meta(self) -> dict:
        return {}

    def policy(self, params, dtype: str):
        return params

    def host_copy(self, params) -> dict[str, np.ndarray]:
        return host_copy(params, self.host.model.compute_dtype)

    def transfer_shapes(self) -> dict:
        return flat_params(abstract_model(self.host.model.arch)[1])

    def from_transfer(self, flat: dict[str, np.ndarray]):
        return params_from_flat(self.host.model.arch, flat)

    def export(self, params, out: Path) -> None:
        pass


class LoraParams:
    """LoRA: the trained params are the adapters; the base is frozen in the compute dtype and
    is also the KL reference."""

    def __init__(self, host: Host):
        self.host = host
        self.base: Any = None
        self.warms_base = warms_base_of(host.plan.algorithm)

    @property
    def shardings(self) -> Any:
        return self.host.model.adapter_shardings

    @property
    def frozen(self) -> tuple:
        return (self.base,)

    def abstract(self):
        return abstract_adapters_on(self.host.model)

    def abstract_frozen(self) -> tuple:
        return (abstract_params(self.host.model, self.host.model.compute_dtype),)

    def step_split(self):
        return lora_split(self.host.model.lora, self.host.model.param_shardings)

    def attach(self, meta: dict | None = None, directory: Path | None = None) -> None:
        """The base (unless the warm-up makes it), checked against a restored step's `meta`
        from `directory` when one is given (a DA rollout host gives none)."""
        if not self.warms_base:
            self.base = base_params(self.host)
            if meta:
                check_base(meta, self.base, directory)

    def set_base(self, base) -> None:
        """The warmed model (compute dtype) as the frozen base (`warms_base`)."""
        self.base = base

    def resumed(self, meta: dict, directory: Path, restore: Callable[[], Any]) -> None:
        if self.warms_base:
            self.base = restore()
            check_base(meta, self.base, directory)

    def fresh(self):
        return fresh_adapters(self.host)

    def new_reference(self, params, save: Callable[[Any], None]):
        return self.base

    def restored_reference(self, restore: Callable[[], Any]):
        return self.base

    def meta(self) -> dict:
        return {BASE_FINGERPRINT: fingerprint(self.base)}

    def policy(self, params, dtype: str):
        return merged_params(self.host.model, self.base, params, dtype)

    def host_copy(self, params) -> dict[str, np.ndarray]:
        return host_copy(adapter_flat(params), self.host.model.compute_dtype)

    def transfer_shapes(self) -> dict:
        return adapter_flat(abstract_adapters(self.host.model.arch, self.host.model.lora))

    def from_transfer(self, flat: dict[str, np.ndarray]):
        return merged_params(self.host.model, self.base, adapters_from_flat(flat),
                             self.host.model.compute_dtype)

    def export(self, params, out: Path) -> None:
        """The adapters in PEFT's layout (fp32, as trained) under `out`/lora."""
        adapters = adapters_from_flat(host_copy(adapter_flat(params), "float32"))
        checkpoint = self.host.model.checkpoint
        export_peft_adapters(self.host.model.lora, adapters, Path(out) / PEFT_DIR,
                             str(checkpoint) if checkpoint else None)


def trained(host: Host) -> FullParams | LoraParams:
    """The split of `host`'s plan: LoRA when it has adapters (algorithm.lora.rank > 0)."""
    return FullParams(host) if host.model.lora is None else LoraParams(host)

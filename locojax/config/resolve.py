"""Resolves `mesh=auto`: the detected topology, and the hardware entry of the detected devices.

`mesh=auto` makes `hardware=auto`, an entry stored here (not a YAML file) whose every value is
`${detected_hardware:<field>}`: when the composed configuration is turned into objects, the
resolver reads that field from the `conf/hardware/` entry whose device kind matches the
devices this run sees (`cpu` when none does). Hydra composes once; an explicit `hardware=`
picks another entry, and `hardware.<field>=` overrides still apply on top.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from compiler import DetectedTopology
from compiler.config import HardwareSpec, MeshKind
from locojax.config.detect import detect_topology, hardware_entry_for

RESOLVER = "detected_hardware"


def _placeholders(cls: type, prefix: str = "") -> dict[str, Any]:
    """`${detected_hardware:<path>}` for every field of `cls`, nested dataclasses as dicts."""
    hints = typing.get_type_hints(cls)
    return {f.name: (_placeholders(hints[f.name], f"{prefix}{f.name}.")
                     if dataclasses.is_dataclass(hints[f.name])
                     else f"${{{RESOLVER}:{prefix}{f.name}}}")
            for f in dataclasses.fields(cls)}


@functools.cache
def _detected_entry(conf_dir: Path) -> Any:
    """The hardware entry (an OmegaConf node) whose device kind matches this run's devices."""
    return OmegaConf.load(conf_dir / "hardware" / f"{hardware_entry_for(detect_topology(), conf_dir)}.yaml")


def register_auto_hardware(store: ConfigStore, conf_dir: Path) -> None:
    """Store `hardware/auto` and the resolver that fills it from the detected entry."""
    OmegaConf.register_new_resolver(
        RESOLVER, lambda path: OmegaConf.select(_detected_entry(conf_dir), path,
                                                throw_on_missing=True), replace=True)
    store.store(group="hardware", name="auto", node=_placeholders(HardwareSpec))


def detected_topology(cfg: Any) -> DetectedTopology | None:
    """What this run sees, for `mesh=auto` (None for a configured mesh)."""
    return detect_topology() if cfg.mesh.kind == MeshKind.auto else None

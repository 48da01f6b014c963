"""Test helpers: typed configs built straight from `conf/` YAML files (no Hydra)."""

from __future__ import annotations

import dataclasses
import types
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml
from omegaconf import OmegaConf

import locojax.config.compose  # noqa: F401 - registers conf's resolvers
from compiler import config as schema
from compiler.model_entry import with_compute_dtype

CONF = Path(__file__).resolve().parents[1] / "conf"


def build(cls: type, data: dict[str, Any]) -> Any:
    """The dataclass `cls` from a YAML mapping, converting scalars by the field types."""
    hints = get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
    return cls(**kwargs)


def _convert(tp: Any, value: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        if value is None:
            return None
        tp = next(a for a in get_args(tp) if a is not type(None))
    if dataclasses.is_dataclass(tp):
        return build(tp, value)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(value)
    if tp is float:
        return float(value)  # PyYAML reads `1e-05` (no dot) as a string
    return value


def entry(group: str, name: str) -> Any:
    """One `conf/<group>/<name>.yaml` entry as its schema dataclass; a model entry without a
    compute dtype gets the accelerators' (bfloat16), as a plan on them would."""
    found = raw_entry(group, name)
    return with_compute_dtype(found, "tpu") if group == "model" else found


@cache
def raw_entry(group: str, name: str) -> Any:
    """One `conf/<group>/<name>.yaml` entry as its schema dataclass, as written."""
    cls = {"model": schema.ModelConfig, "workload": schema.WorkloadConfig,
           "hardware": schema.HardwareSpec, "mesh": schema.MeshConfig,
           "placement": schema.PlacementConfig, "controller": schema.ControllerConfig,
           "algorithm": schema.AlgorithmConfig}[group]
    data = OmegaConf.create(yaml.safe_load((CONF / group / f"{name}.yaml").read_text()))
    # conf's own resolvers (`locojax.by_ratio_level`) are registered by importing compose
    return build(cls, OmegaConf.to_container(data, resolve=True))


def make_config(model: str = "tiny", workload: str = "arith", hardware: str = "cpu",
                mesh: dict[str, Any] | None = None, placement: dict[str, Any] | None = None,
                controller: str = "local",
                overrides: dict[str, dict[str, Any]] | None = None) -> schema.Config:
    """A Config from named entries, plus field overrides per section (`{"workload": {...}}`)."""
    base = schema.Config(
        model=raw_entry("model", model), workload=entry("workload", workload),
        hardware=entry("hardware", hardware), controller=entry("controller", controller),
        algorithm=entry("algorithm", "grpo"))
    base = dataclasses.replace(base, mesh=build(schema.MeshConfig, mesh or {}),
                               placement=build(schema.PlacementConfig, placement or {}))
    for name, fields in (overrides or {}).items():
        base = dataclasses.replace(base, **{name: dataclasses.replace(getattr(base, name),
                                                                      **fields)})
    # `model.dtype: null` is the platform's, as composition makes it.
    return dataclasses.replace(base, model=with_compute_dtype(base.model,
                                                              base.hardware.platform))


def config_value(cfg: schema.Config, key: str) -> Any:
    """The value a PlanError key names: a dotted field, or a group's entry name / kind."""
    if key == "controller":
        return cfg.controller.kind
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node.name if dataclasses.is_dataclass(node) else node

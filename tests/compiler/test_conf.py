"""The user-facing surface: every conf/ file matches its schema and every experiment composes."""

import dataclasses
from pathlib import Path

import pytest
import yaml
from hydra.errors import ConfigCompositionException

from compiler import config as schema
from locojax.config.compose import CONF_DIR, compose_config

GROUP_SCHEMAS = {
    "model": schema.ModelConfig,
    "workload": schema.WorkloadConfig,
    "mesh": schema.MeshConfig,
    "hardware": schema.HardwareSpec,
    "placement": schema.PlacementConfig,
    "controller": schema.ControllerConfig,
    "algorithm": schema.AlgorithmConfig,
}
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def _field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _group_files():
    for group, cls in GROUP_SCHEMAS.items():
        for path in sorted((CONF_DIR / group).glob("*.yaml")):
            yield pytest.param(path, cls, id=f"{group}/{path.stem}")


@pytest.mark.parametrize("path,cls", list(_group_files()))
def test_group_file_keys_equal_schema_fields(path: Path, cls):
    data = yaml.safe_load(path.read_text())
    if "defaults" in data:  # an alias entry that only includes another file
        assert set(data) == {"defaults"}
        return
    assert set(data) == _field_names(cls), f"{path} keys differ from {cls.__name__}"
    for name, value in data.items():
        sub = {f.name: f for f in dataclasses.fields(cls)}[name]
        if dataclasses.is_dataclass(sub.default_factory() if callable(sub.default_factory) else None):
            assert set(value) == _field_names(type(sub.default_factory())), f"{path}:{name}"


@pytest.mark.parametrize("group", sorted(GROUP_SCHEMAS))
def test_every_group_option_composes(group):
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        cfg = compose_config([f"{group}={path.stem}"])
        assert isinstance(cfg, schema.Config)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes(name):
    cfg = compose_config([f"+experiment={name}"])
    assert cfg.mesh.kind == schema.MeshKind.auto, "experiments default to mesh=auto"
    want = "disaggregated" if name.endswith("_da") else "colocated"
    assert cfg.placement.mode == want


def test_paper_settings():
    assert compose_config(["+experiment=gsm8k_co"]).model.name == "qwen3_0_6b"
    assert compose_config(["+experiment=arith_co"]).model.name == "tiny"


def test_hardware_follows_mesh_and_can_be_overridden():
    assert compose_config(["mesh=v7x"]).hardware.name == "v7x"
    assert compose_config(["mesh=h100"]).hardware.name == "h100"
    assert compose_config(["mesh=v7x", "hardware=v5p"]).hardware.name == "v5p"


@pytest.mark.parametrize(
    "override", ["mesh.chipz=3", "mesh.chips=abc", "placement.mode=sideways", "model=qwen9"]
)
def test_unknown_or_mistyped_key_fails_at_compose(override):
    with pytest.raises(ConfigCompositionException):
        compose_config([override])


def test_schema_objects_are_frozen():
    cfg = compose_config([])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.run.steps = 3  # type: ignore[misc]

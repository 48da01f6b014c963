"""Resolves `mesh=auto`: detect the devices, and pick the matching hardware entry."""

from __future__ import annotations

from typing import Any

from hydra import compose
from hydra.core.hydra_config import HydraConfig

from compiler import DetectedTopology
from compiler.config import MeshKind
from locojax.config.compose import CONF_DIR, to_config
from locojax.config.detect import detect_topology, hardware_entry_for


def detected_topology_for(cfg: Any) -> tuple[Any, DetectedTopology | None]:
    """For `mesh=auto`, the detected topology, and the config with its hardware entry.

    Only the hardware entry is re-chosen (by recomposing with `hardware=<entry>` and the
    user's own overrides, so an explicit `hardware=` still wins); the compiler derives
    everything else from the detected topology.
    """
    if cfg.mesh.kind != MeshKind.auto:
        return cfg, None
    detected = detect_topology()
    entry = hardware_entry_for(detected, CONF_DIR)
    if entry == cfg.hardware.name:
        return cfg, detected
    hydra_cfg = HydraConfig.get()
    overrides = list(hydra_cfg.overrides.task)
    if any(o.split("=", 1)[0].lstrip("+~") == "hardware" for o in overrides):
        return cfg, detected
    raw = compose(config_name=hydra_cfg.job.config_name, overrides=[*overrides, f"hardware={entry}"])
    return to_config(raw), detected

"""Detects the devices and processes a run sees, for `mesh=auto`."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from compiler import DetectedTopology


@functools.cache
def detect_topology() -> DetectedTopology:
    """Hosts (JAX processes), devices per host, platform and device kind of this run."""
    import jax  # mesh=auto only: the plan entry point composes without loading JAX

    device = jax.local_devices()[0]
    return DetectedTopology(
        hosts=jax.process_count(),
        devices_per_host=jax.local_device_count(),
        platform=device.platform,
        device_kind=device.device_kind,
    )


def hardware_entry_for(detected: DetectedTopology, conf_dir: Path) -> str:
    """The `conf/hardware/` entry whose device kind matches the detected devices."""
    fallback = "cpu"
    for path in sorted((conf_dir / "hardware").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text()) or {}
        if spec.get("device_kind") == detected.device_kind:
            return path.stem
        if spec.get("platform") == detected.platform and detected.platform != "cpu":
            fallback = path.stem
    return fallback

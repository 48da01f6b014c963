"""Detects the devices and processes a run sees, for `mesh=auto`."""

from __future__ import annotations

import functools
import glob
import os
from pathlib import Path

import yaml

from compiler import DetectedTopology

ACCELERATOR_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*", "/dev/kfd")
"""Device files of TPU chips (v4, v5e: accel; v5p, v6e, TPU7x: vfio), NVIDIA and AMD GPUs."""


def cpu_only_machine() -> bool:
    """Whether this machine has no accelerator device file (`ACCELERATOR_FILES`)."""
    return not any(glob.glob(pattern) for pattern in ACCELERATOR_FILES)


@functools.cache
def detect_topology() -> DetectedTopology:
    """Hosts (JAX processes), devices per host, platform and device kind of this run.

    On a machine with no accelerator and no JAX_PLATFORMS the backend is CPU alone: with the
    `tpu` extra installed JAX would otherwise load libtpu, probe for chips and log errors."""
    import jax  # mesh=auto only: the plan entry point composes without loading JAX

    if not os.environ.get("JAX_PLATFORMS") and cpu_only_machine():
        jax.config.update("jax_platforms", "cpu")
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

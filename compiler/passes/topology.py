"""Pass 0: the machine. Hosts, devices per host and chips from the mesh and hardware entries.

- `tpu`/`gpu`: `mesh.chips=0` means "the smallest machine that fits": `compile_plan` tries the
  chip counts of `fit_chip_counts` (valid slice sizes of >= `FIT_MIN_HOSTS` hosts, from the
  count whose HBM holds the training state) in order and keeps the first whose plan compiles
  (`Topology.chips_from = memory_fit`). Otherwise `mesh.chips` is given; hosts = chips /
  hardware.chips_per_host. The chip count must be valid for the machine (TPU torus slices
  of whole hosts or one v5e/v6e 4-chip host, whole GPU hosts: the rules of
  `compiler.hardware`).
- `cpu`: emulated hosts, `mesh.hosts` x `mesh.devices_per_host`, one device per chip.
- `auto`: whatever the coordination layer detected (1 host x 1 device when nothing was).
"""

from __future__ import annotations

from collections.abc import Iterator

from compiler.config import AlgorithmConfig, HardwareSpec, MeshConfig, MeshKind, ModelConfig
from compiler.errors import PlanError
from compiler.hardware import (
    min_chips_for_training,
    partial_host,
    slice_rule,
    slice_shape,
    valid_chip_count,
)
from compiler.plan import ChipSource, DetectedTopology, Topology

FIT_MIN_HOSTS = 2
"""Hosts a memory-fit machine has at least: one host would hide the multi-host costs."""
FIT_MAX_CHIPS = 9216
"""Largest machine the memory-fit search tries (a full TPU7x pod)."""

def fits_by_memory(mesh: MeshConfig) -> bool:
    """Whether `mesh` asks the compiler to choose the chip count (`mesh.chips=0` on tpu/gpu)."""
    return mesh.kind in (MeshKind.tpu, MeshKind.gpu) and mesh.chips == 0


def fit_chip_counts(model: ModelConfig, hw: HardwareSpec, algorithm: AlgorithmConfig,
                    min_hosts: int = FIT_MIN_HOSTS,
                    max_chips: int = FIT_MAX_CHIPS) -> Iterator[int]:
    """Valid chip counts of >= `min_hosts` hosts, smallest first, from the training-state fit."""
    chips = max(min_chips_for_training(model, hw, algorithm),
                min_hosts * max(hw.chips_per_host, 1), 1)
    for n in range(chips, max_chips + 1):
        if valid_chip_count(hw, n):
            yield n


def resolve_topology(mesh: MeshConfig, hw: HardwareSpec,
                     detected: DetectedTopology | None) -> Topology:
    """Hosts, devices and chips of the configured (or detected) machine."""
    if mesh.kind == MeshKind.cpu:
        hosts, per_host, chips, shape = _cpu(mesh)
        platform, device_kind = "cpu", hw.device_kind
    elif mesh.kind in (MeshKind.tpu, MeshKind.gpu):
        hosts, per_host, chips, shape = _accelerator(mesh, hw)
        platform, device_kind = str(mesh.kind), hw.device_kind
    else:
        hosts, per_host, chips, shape = _auto(mesh, hw, detected)
        platform = detected.platform if detected else hw.platform
        device_kind = detected.device_kind if detected else hw.device_kind
    if hw.platform != platform:
        raise PlanError(
            "hardware", hw.name,
            f"platform {hw.platform} does not match the {platform} devices of mesh.kind="
            f"{mesh.kind}; choose a {platform} hardware entry", "platform")
    if hw.hbm_bytes <= 0:
        raise PlanError("hardware", hw.name, "hbm_bytes must be > 0", "hardware_spec")
    return Topology(
        accelerator=hw.name, mesh_kind=MeshKind(mesh.kind), platform=platform,
        device_kind=device_kind, hosts=hosts, devices_per_host=per_host, chips=chips,
        slice_shape=shape,
        device_memory_bytes=hw.hbm_bytes / max(hw.devices_per_chip, 1), hardware=hw,
        chips_from=ChipSource.detected if mesh.kind == MeshKind.auto and detected
        else ChipSource.config)


def _cpu(mesh: MeshConfig) -> tuple[int, int, int, tuple[int, ...]]:
    if mesh.chips != 0:
        raise PlanError("mesh.chips", mesh.chips,
                        "derived as hosts x devices_per_host for mesh.kind=cpu; leave it 0",
                        "derived")
    for key, value in (("mesh.hosts", mesh.hosts),
                       ("mesh.devices_per_host", mesh.devices_per_host)):
        if value < 1:
            raise PlanError(key, value, "must be at least 1 for mesh.kind=cpu", "positive")
    return mesh.hosts, mesh.devices_per_host, mesh.hosts * mesh.devices_per_host, ()


def _accelerator(mesh: MeshConfig, hw: HardwareSpec) -> tuple[int, int, int, tuple[int, ...]]:
    for key, value in (("mesh.hosts", mesh.hosts),
                       ("mesh.devices_per_host", mesh.devices_per_host)):
        if value != 0:
            raise PlanError(key, value, f"derived from mesh.chips and hardware {hw.name} for "
                            f"mesh.kind={mesh.kind}; leave it 0", "derived")
    chips, per_host = mesh.chips, hw.chips_per_host
    if chips < 1:
        raise PlanError("mesh.chips", chips, f"a {mesh.kind} mesh needs at least 1 chip",
                        "positive")
    if per_host < 1 or hw.devices_per_chip < 1:
        raise PlanError("hardware", hw.name, f"chips_per_host={per_host} and devices_per_chip="
                        f"{hw.devices_per_chip} must be >= 1 for a {mesh.kind} mesh",
                        "hardware_spec")
    shape: tuple[int, ...] = ()
    if hw.slice_topology == "torus3d":
        torus = slice_shape(hw, chips)
        if torus is None:
            raise PlanError("mesh.chips", chips, f"not a valid TPU slice size for {hw.name} "
                            f"({slice_rule(hw, chips)})", "tpu_slice")
        shape = torus
    if chips % per_host == 0:
        hosts = chips // per_host
    elif partial_host(hw, chips):
        hosts, per_host = 1, chips
    else:
        raise PlanError("mesh.chips", chips, f"not a multiple of the {per_host} chips per "
                        f"host of {hw.name}", "whole_hosts")
    return hosts, per_host * hw.devices_per_chip, chips, shape


def _auto(mesh: MeshConfig, hw: HardwareSpec,
          detected: DetectedTopology | None) -> tuple[int, int, int, tuple[int, ...]]:
    for key, value in (("mesh.chips", mesh.chips), ("mesh.hosts", mesh.hosts),
                       ("mesh.devices_per_host", mesh.devices_per_host)):
        if value != 0:
            raise PlanError(key, value, "mesh.kind=auto detects devices; leave it 0 or choose "
                            "mesh=cpu/tpu/gpu", "derived")
    hosts, per_host = (detected.hosts, detected.devices_per_host) if detected else (1, 1)
    if hosts < 1 or per_host < 1:
        raise PlanError("mesh.kind", mesh.kind, f"detected {hosts} hosts x {per_host} devices; "
                        "need at least 1 of each", "positive")
    devices = hosts * per_host
    per_chip = max(hw.devices_per_chip, 1)
    chips = devices // per_chip if devices % per_chip == 0 else devices
    return hosts, per_host, chips, ()

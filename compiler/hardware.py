"""Machine rules of a hardware entry: TPU slice shapes, valid chip counts, the smallest fit.

A leaf of the compiler: it reads the hardware entry and the memory budgets, and the
topology pass and the cost model both ask it, so neither imports the other.

- TPU slices (`slice_topology: torus3d`) are tori. v4, v5p and TPU7x: 3D, 2x2x1, 2x2x2,
  2x2x4, 2x4x4, or AxBxC with every dim a multiple of 4 (multiples of 64 chips). v5e and
  v6e: 2D, 2x2 up to their 16x16 pod (`generations.TPU_GENERATIONS` says which, by device
  kind). Whole hosts, or a v5e/v6e slice below one host (a 4-chip VM).
- GPUs (`slice_topology: switched`) fill whole hosts, or are 1, 2 or 4 GPUs of one host.
- Any other machine accepts any positive chip count.
- `tpu_slice` names a TPU slice as JAX's compile-only topology API
  (`jax.experimental.topologies.get_topology_desc`) takes it: `v5e:4x4`, `tpu7x:4x4x4`, ...
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, prod

from compiler.config import AlgorithmConfig, HardwareSpec, ModelConfig
from compiler.cost import memory
from compiler.errors import PlanError
from compiler.generations import TPU_GENERATIONS, TpuGeneration

SMALL_TORI = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4)}
"""3D slices below one 4x4x4 cube."""
SLICE_RULE = "3D torus slices have 4, 8, 16, 32 chips, or multiples of 64 built from 4x4x4 cubes"
"""`SMALL_TORI` and the cube rule, as an error message says it."""
PARTIAL_HOST_GPUS = (1, 2, 4)
"""GPU counts a switched machine accepts below one whole host."""


HOST_BOUNDS = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}
"""Chips per host -> `get_topology_desc(chips_per_host_bounds=...)`: the host's chip block."""


@dataclass(frozen=True)
class TpuSlice:
    """A plan's TPU slice as JAX's compile-only topology API takes it."""

    topology_name: str
    """`get_topology_desc(topology_name=...)`, e.g. `v5e:4x4`, `tpu7x:4x4x4`."""
    accelerator_type: str
    """`TPU_ACCELERATOR_TYPE`, e.g. `v5litepod-16`, `tpu7x-128`."""
    chip_config: str
    """`chip_config_name`: `default` or `megacore`."""
    host_bounds: tuple[int, int, int]
    """`chips_per_host_bounds`: the chip block of one host."""
    wrap: tuple[bool, bool, bool]
    """`wrap`: which dimensions close into a ring (full 4-chip cubes, 16-chip v5e/v6e rows)."""
    hosts: int
    """Processes the description has (one per host)."""
    devices: int
    """JAX devices in all."""
    device_hbm_bytes: float
    """One device's HBM as the TPU compiler counts it."""


def tpu_generation(hw: HardwareSpec) -> TpuGeneration | None:
    """The TPU generation of a hardware entry (by device kind), or None."""
    return TPU_GENERATIONS.get(hw.device_kind) if hw.platform == "tpu" else None


def _square_shape(chips: int, pod_chips: int) -> tuple[int, int] | None:
    """AxB (A <= B, powers of two, B <= 2A) of a 2D slice: 1x1 (one chip's VM), 2x2 ... 16x16."""
    if chips == 1:
        return (1, 1)
    if chips < 4 or chips > pod_chips or chips & (chips - 1):
        return None
    a = 1 << (chips.bit_length() - 1) // 2
    return (a, chips // a)


def slice_shape(hw: HardwareSpec, chips: int) -> tuple[int, ...] | None:
    """The torus shape of a TPU slice of `chips` chips of `hw`, or None if it is not one."""
    gen = tpu_generation(hw)
    if gen is not None and gen.dims == 2:
        return _square_shape(chips, gen.pod_chips)
    if gen is not None and chips > gen.pod_chips:
        return None
    return torus_shape(chips)


def slice_rule(hw: HardwareSpec, chips: int) -> str:
    """Why `chips` is not a slice of `hw`, as an error message says it."""
    gen = tpu_generation(hw)
    if gen is not None and chips > gen.pod_chips:
        return f"a {hw.name} slice has at most {gen.pod_chips} chips"
    if gen is not None and gen.dims == 2:
        return "2D torus slices have 1, 4, 8, 16, ... chips (powers of 2 but 2)"
    return SLICE_RULE


def torus_shape(chips: int) -> tuple[int, int, int] | None:
    """The most cubic 3D torus shape of a TPU slice of `chips` chips, or None if invalid."""
    if chips in SMALL_TORI:
        return SMALL_TORI[chips]
    if chips < 64 or chips % 64:
        return None
    cubes = chips // 64
    best = (1, 1, cubes)
    for a in range(1, round(cubes ** (1 / 3)) + 2):
        if cubes % a:
            continue
        for b in range(a, int((cubes // a) ** 0.5) + 1):
            if (cubes // a) % b == 0:
                c = cubes // a // b
                if c >= b and max(a, b, c) < max(best):
                    best = (a, b, c)
    return (4 * best[0], 4 * best[1], 4 * best[2])


def partial_host(hw: HardwareSpec, chips: int) -> bool:
    """Whether `chips` chips of one host are a machine of their own: 1, 2 or 4 GPUs of a
    switched host, a v5e/v6e slice below one host."""
    if chips >= hw.chips_per_host:
        return False
    if hw.slice_topology == "switched":
        return chips in PARTIAL_HOST_GPUS
    gen = tpu_generation(hw)
    return hw.slice_topology == "torus3d" and gen is not None and (
        chips in gen.partial_host_chips)


def valid_chip_count(hw: HardwareSpec, chips: int) -> bool:
    """Whether `chips` is a machine the compiler accepts for `hw` (its topology rules)."""
    per_host = hw.chips_per_host
    if chips < 1:
        return False
    if hw.slice_topology == "torus3d":
        return slice_shape(hw, chips) is not None and (
            chips % max(per_host, 1) == 0 or partial_host(hw, chips))
    if hw.slice_topology == "switched":
        return chips % per_host == 0 or partial_host(hw, chips)
    return True


def min_chips_for_training(model: ModelConfig, hw: HardwareSpec,
                           algorithm: AlgorithmConfig | None = None) -> int:
    """Smallest valid chip count whose HBM holds the training state under FSDP over all chips.

    The state may fill `memory.TRAIN_STATE_FRACTION` of each device, as in the sharding pass.
    """
    state = memory.training_state_bytes(model, algorithm or AlgorithmConfig())
    chips = max(ceil(state / (hw.hbm_bytes * memory.TRAIN_STATE_FRACTION)), 1)
    while not valid_chip_count(hw, chips):
        chips += 1
    return chips


def _wrap(shape: tuple[int, ...], dims: int) -> tuple[bool, bool, bool]:
    """Dimensions that close into a ring: a 3D slice of whole 4x4x4 cubes wraps in all three;
    a 2D slice in each dimension of 16 chips (MaxText's `wrap` for v5e/v6e 8x16, 16x16)."""
    if dims == 3:
        return (prod(shape) >= 64,) * 3
    return (shape[0] == 16, shape[1] == 16, False)


def tpu_slice(hw: HardwareSpec, chips: int, hosts: int) -> TpuSlice:
    """The topology name and host layout JAX's compile-only TPU devices need for `chips`
    chips of `hw` on `hosts` hosts; a `PlanError` naming the key when JAX cannot describe it."""
    gen = tpu_generation(hw)
    if gen is None:
        known = ", ".join(f"{kind} ({g.prefix})" for kind, g in TPU_GENERATIONS.items())
        raise PlanError("hardware", hw.name, f"device kind {hw.device_kind!r} on platform "
                        f"{hw.platform} has no TPU topology JAX can describe; the TPU "
                        f"compiler knows {known}", "tpu_target")
    shape = slice_shape(hw, chips)
    if shape is None:
        raise PlanError("mesh.chips", chips, f"not a TPU slice JAX can describe for "
                        f"{hw.name} ({slice_rule(hw, chips)})", "tpu_target")
    per_host = chips // max(hosts, 1)
    if hosts < 1 or per_host * hosts != chips or per_host not in HOST_BOUNDS:
        raise PlanError("mesh.chips", chips, f"{hosts} hosts of {hw.name}: JAX describes TPU "
                        f"hosts of {', '.join(map(str, HOST_BOUNDS))} chips", "tpu_target")
    devices_per_chip = max(hw.devices_per_chip, 1)
    return TpuSlice(
        topology_name=f"{gen.prefix}:{'x'.join(map(str, shape))}",
        accelerator_type=f"{gen.accelerator}-{chips * gen.type_cores_per_chip}",
        chip_config=gen.chip_config, host_bounds=HOST_BOUNDS[per_host],
        wrap=_wrap(shape, gen.dims), hosts=hosts, devices=chips * devices_per_chip,
        device_hbm_bytes=gen.device_hbm_bytes)

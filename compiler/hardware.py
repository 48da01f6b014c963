"""Machine rules of a hardware entry: TPU torus shapes, valid chip counts, the smallest fit.

A leaf of the compiler: it reads the hardware entry and the memory budgets, and the
topology pass and the cost model both ask it, so neither imports the other.

- TPU slices (`slice_topology: torus3d`) are 3D tori: 2x2x1, 2x2x2, 2x2x4, 2x4x4, or AxBxC
  with every dim a multiple of 4 (multiples of 64 chips), in whole hosts.
- GPUs (`slice_topology: switched`) fill whole hosts, or are 1, 2 or 4 GPUs of one host.
- Any other machine accepts any positive chip count.
"""

from __future__ import annotations

from math import ceil

from compiler.config import AlgorithmConfig, HardwareSpec, ModelConfig
from compiler.cost import memory

SMALL_TORI = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4)}
"""Slices below one 4x4x4 cube."""
SLICE_RULE = "3D torus slices have 4, 8, 16, 32 chips, or multiples of 64 built from 4x4x4 cubes"
"""`SMALL_TORI` and the cube rule, as an error message says it."""
PARTIAL_HOST_GPUS = (1, 2, 4)
"""GPU counts a switched machine accepts below one whole host."""


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
    """Whether `chips` GPUs of one switched host are a machine of their own (1, 2 or 4)."""
    return hw.slice_topology == "switched" and chips < hw.chips_per_host and (
        chips in PARTIAL_HOST_GPUS)


def valid_chip_count(hw: HardwareSpec, chips: int) -> bool:
    """Whether `chips` is a machine the compiler accepts for `hw` (its topology rules)."""
    per_host = hw.chips_per_host
    if chips < 1:
        return False
    if hw.slice_topology == "torus3d":
        return torus_shape(chips) is not None and chips % max(per_host, 1) == 0
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

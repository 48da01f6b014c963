"""The TPU generations: what JAX's topology API, the TPU compiler and the memory model know of
each, one record per generation, found by the device kind JAX reports.

A leaf of the compiler: `hardware` (slices, chip counts) and the cost model (`cost.memory`,
`cost.prefill`) read it; it reads nothing of theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class TpuGeneration:
    """How JAX's TPU topology API and the TPU compiler see one TPU generation."""

    prefix: str
    """Topology name prefix `get_topology_desc` accepts (`v5e` in `v5e:2x2`)."""
    accelerator: str
    """`TPU_ACCELERATOR_TYPE` prefix (`v5litepod` in `v5litepod-16`)."""
    type_cores_per_chip: int
    """TensorCores per chip the accelerator type's number counts (`v5p-8` is 4 chips)."""
    dims: int
    """Torus dimensions: 2 (v5e, v6e) or 3."""
    chip_config: str
    """`get_topology_desc(chip_config_name=...)`: `megacore` makes a v4 chip one device."""
    pod_chips: int
    """Largest single slice (chips)."""
    device_hbm_bytes: float
    """One device's HBM as the TPU compiler reports it (its out-of-memory message,
    libtpu 0.0.42.1, measured 2026-12-03)."""
    partial_host_chips: tuple[int, ...] = ()
    """Slices below one host that are a host of their own (v5e/v6e 1- and 4-chip VMs)."""
    head_kept_copies: float | None = None
    """fp32 T x V buffers per row the compiler keeps for a head that keeps its softmax, where
    it is not `cost.memory.TPU_ACTIVATIONS`'s 1.6: TPU7x's keeps 1.7-1.8 (Qwen3-0.6B at 96
    rows a device on 8 chips and 12 on 64, Qwen3-1.7B at 96; docs/aot.md "The kept head")."""
    embedding_relayout: bool = False
    """The compiler re-tiles the embedding table for the rollout's token lookup (the
    SparseCore data format: a second copy of the table beside the weights; measured with
    `locojax.aot` on tpu7x; v5e keeps none; v5p and v6e, which have SparseCores too, are not
    measured): `cost.memory.embedding_relayout_bytes`."""
    weight_retile: bool = False
    """The compiler re-tiles the prefill's layer-stacked matmul weights (measured on tpu7x;
    v5e, v5p and v6e make no such copy): `cost.prefill`'s `retile`."""
    episode_key_relayout: bool = False
    """The compiler re-lays a multi-turn wave's cached keys for its matmuls: a copy of every
    episode's keys (half its K and V) beside the caches, in turn 0's extend and in the decode
    loop (measured on tpu7x: 15.7 and 17.1 GiB of temporaries for 15.75 GiB of keys; v5e
    keeps 0.2-1.5 GiB): `cost.memory.episode_key_relayout_bytes`."""


TPU_GENERATIONS: dict[str, TpuGeneration] = {
    "TPU v4": TpuGeneration("v4", "v4", 2, 3, "megacore", 4096, 30.75 * GIB),
    "TPU v5 lite": TpuGeneration("v5e", "v5litepod", 1, 2, "default", 256, 15.75 * GIB,
                                 (1, 4)),
    "TPU v5": TpuGeneration("v5", "v5p", 2, 3, "megacore", 8960, 95.74 * GIB),
    "TPU v6 lite": TpuGeneration("v6e", "v6e", 1, 2, "default", 256, 31.25 * GIB, (1, 4)),
    "TPU7x": TpuGeneration("tpu7x", "tpu7x", 2, 3, "default", 9216, 94.75 * GIB,
                           head_kept_copies=1.8, embedding_relayout=True, weight_retile=True,
                           episode_key_relayout=True),
}
"""TPU generations by `hardware.device_kind` (what `jax.devices()[0].device_kind` says).
Names and chip configs as MaxText's `accelerator_to_spec_map.py` maps them and JAX 0.10.2
with libtpu 0.0.42.1 accepts them (`v7x:...` is refused: TPU7x is `tpu7x`); pod sizes from
the Cloud TPU documentation (v5p's 8960-chip pod: the largest slice is 6144)."""

"""The two axis vocabularies: logical axes (what a dimension means) and mesh axes (devices).

Parameters carry logical axis names; the compiler's rule tables map them to mesh axes per
role (training storage, rollout). The model never names a mesh axis.
"""

from __future__ import annotations

from enum import StrEnum


class LogicalAxis(StrEnum):
    """What a tensor dimension means, independent of any device layout."""

    BATCH = "batch"
    LENGTH = "length"
    LAYERS = "layers"
    EMBED = "embed"
    HEADS = "heads"
    KV_HEADS = "kv_heads"
    HEAD_DIM = "head_dim"
    MLP = "mlp"
    VOCAB = "vocab"
    NORM = "norm"
    LORA_RANK = "lora_rank"


class MeshAxis(StrEnum):
    """Physical device axes of the plan's meshes."""

    DATA = "data"
    """Replicas of the training state (data parallel, across host groups)."""
    FSDP = "fsdp"
    """Devices that shard one copy of the training state (within a host group)."""
    REPLICA = "replica"
    """Independent rollout model replicas on a host."""
    TENSOR = "tensor"
    """Devices that share one rollout replica (tensor parallel)."""

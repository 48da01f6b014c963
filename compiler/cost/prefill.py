"""The rollout prefill's peak on one device: what the TPU compiler allocates for program 1.

Program 1 of a generation (`locojax/rollout/prefill.py`) runs one forward of a replica's
`prompt_store_rows` prompts, left-padded to W = max_prompt_len columns, scanned over the
layer-stacked rollout weights, and returns every prompt's KV (the prompt store), token 0
of each row and the sampler's uniforms. Its buffers at the TPU compiler's peak (buffer
assignments of libtpu 0.0.42.1 at Qwen3-0.6B widths, 2, 4 and 28 layers, on v5e, v5p,
v6e and tpu7x; docs/aot.md):

    weights       the rollout weights (the program's arguments)
    store         the prompt KV store it returns: K and V of every layer, W columns each
    key_relayout  the keys once more: the layer loop carries them with the W dimension
                  minor (the layout its Q.K^T dot takes) and copies them into the store's
                  layout after the loop, half the store again
    attention     per prompt, one block's working set: `PREFILL_SCORE_COPIES` fp32
                  H x W x W tensors (the scores and the probabilities; the query heads of
                  one device) and the block's hidden state (W x D, compute dtype)
    uniforms      the sampler's uniforms of every row the replica decodes (T x 2 fp32)
    retile        on a TPU7x only (`generations.TpuGeneration.weight_retile`): a second copy of the
                  layer-stacked weights whose contracted dimension is one of their two
                  tiled (minor) dimensions (o_proj, the MLP's gate, up and down), re-tiled
                  from the arguments' 8-row bf16 tiles to the 16-row ones its matmuls take

The compiler packs some of the attention's temporaries into the store's buffer before the
keys are written there (at 28 layers one score tensor fits), so the sum counts up to one
score tensor per prompt more than the compiler's peak (plan/compiler 1.05-1.06 at 28
layers; 0.89-1.05 at 2 layers, where the compiler's own per-layer weight copies and its
peak's other small buffers are a larger share and are not counted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from compiler.axes import LogicalAxis, MeshAxis
from compiler.config import ModelConfig
from compiler.cost.memory import (
    dtype_bytes,
    episode_key_relayout_bytes,
    kv_columns,
    sharded_elements,
)
from compiler.generations import TPU_GENERATIONS
from compiler.params import param_table
from compiler.passes.lengths import cache_len, multi_turn, reply_len

if TYPE_CHECKING:
    from compiler.plan import ExecutionPlan

PREFILL_SCORE_COPIES = 2
"""fp32 H x W x W attention tensors the TPU compiler keeps live per prompt in the prefill's
block: the scores and the softmax's probabilities (read from its buffer assignments at 2 and
4 layers on v5e, v5p and v6e and at 28 on tpu7x; at 28 layers on v5e one of them sits in
the store's buffer before the keys are written there)."""
CONTRACTED_MINOR_AXES = (LogicalAxis.EMBED, LogicalAxis.MLP, LogicalAxis.HEAD_DIM)
"""A weight whose second-minor dimension is one of these is contracted over a tiled
dimension (gate/up: EMBED, down: MLP, o_proj: HEAD_DIM); q/k/v_proj's are HEADS/KV_HEADS."""


@dataclass(frozen=True)
class PrefillMemory:
    """Bytes of the prefill's peak on one rollout device, by what holds them."""

    weights: float
    store: float
    key_relayout: float
    attention: float
    uniforms: float
    retile: float

    @property
    def total(self) -> float:
        return (self.weights + self.store + self.key_relayout + self.attention
                + self.uniforms + self.retile)


def retiled_weight_bytes(model: ModelConfig, device_kind: str,
                         specs: dict[str, tuple[MeshAxis | None, ...]],
                         mesh: dict[MeshAxis, int]) -> float:
    """Bytes of the re-tiled weight copy one rollout device holds in the prefill (`specs` on
    `mesh`: the rollout layout); 0 where the compiler makes none
    (`TpuGeneration.weight_retile`)."""
    generation = TPU_GENERATIONS.get(device_kind)
    if generation is None or not generation.weight_retile:
        return 0.0
    table = tuple(p for p in param_table(model) if len(p.shape) >= 3
                  and p.axes[0] == LogicalAxis.LAYERS and p.axes[-2] in CONTRACTED_MINOR_AXES)
    return sharded_elements(table, specs, mesh) * dtype_bytes(model)


def prefill_memory(model: ModelConfig, *, prompts: int, width: int, store_bytes: float,
                   weights_bytes: float, query_heads: int, rows: int, response_len: int,
                   retile_bytes: float = 0.0) -> PrefillMemory:
    """The prefill's peak on one device (module docstring): `prompts` prompts of `width`
    columns whose store takes `store_bytes` (K and V, the KV dtype), `query_heads` query
    heads on the device, `rows` rows of `response_len` tokens decoded after it."""
    scores = PREFILL_SCORE_COPIES * query_heads * width * width * 4
    hidden = width * model.hidden * dtype_bytes(model)
    return PrefillMemory(
        weights=float(weights_bytes), store=float(store_bytes), key_relayout=store_bytes / 2,
        attention=float(prompts * (scores + hidden)), uniforms=float(rows * response_len * 2 * 4),
        retile=float(retile_bytes))


EXTEND_SCORE_COPIES = 1
"""fp32 H x W x S score tensors per episode live in a multi-turn batch's turn-0 extend: its
temporaries were 439 MB at 2 layers on v5e (16 episodes, 256 opening and 1,536 cache
columns, 16 query heads), where one copy is 403 MB and two would be 805."""


def extend_memory(model: ModelConfig, *, episodes: int, width: int, columns: int,
                  cache_bytes: float, weights_bytes: float, query_heads: int,
                  response_len: int, retile_bytes: float = 0.0,
                  key_relayout_bytes: float = 0.0) -> PrefillMemory:
    """Turn 0 of a multi-turn batch on one device (`locojax/rollout/episodes.py`): every
    episode's opening (`width` columns) fed into the episodes' caches (`cache_bytes`, its
    argument, updated in place), each query scoring all `columns` of its episode's cache,
    and the uniforms of its `response_len` draws; `key_relayout_bytes`: the episodes' keys
    re-laid beside the caches where the compiler does so (TPU7x:
    `cost.memory.episode_key_relayout_bytes`)."""
    scores = EXTEND_SCORE_COPIES * query_heads * width * columns * 4
    hidden = width * model.hidden * dtype_bytes(model)
    return PrefillMemory(
        weights=float(weights_bytes), store=float(cache_bytes),
        key_relayout=float(key_relayout_bytes),
        attention=float(episodes * (scores + hidden)),
        uniforms=float(episodes * response_len * 2 * 4), retile=float(retile_bytes))


def plan_prefill_bytes(plan: ExecutionPlan) -> float:
    """The prefill's peak per device of a plan: the rollout weights, the prompt KV store (its
    prompt columns) and the compiler's buffers beside them (`prefill_memory`); for a
    multi-turn plan, turn 0's extend of one wave (`extend_memory`). What `locojax.aot` holds
    against the compiled program 1."""
    model, b, rollout = plan.model.config, plan.batch, plan.sharding.rollout
    heads = model.num_heads / _split(rollout, "layers/attn/q_proj", 2)
    retile = retiled_weight_bytes(model, plan.topology.device_kind, rollout.specs, rollout.mesh)
    if multi_turn(plan.workload):
        rows = b.slots  # one wave's episodes
        return extend_memory(
            model, episodes=rows, width=b.max_prompt_len,
            columns=cache_len(plan.workload, plan.sampling),
            cache_bytes=rows * b.kv_bytes_per_sequence, weights_bytes=rollout.bytes_per_device,
            query_heads=heads, response_len=reply_len(plan.workload, plan.sampling),
            retile_bytes=retile, key_relayout_bytes=rows * episode_key_relayout_bytes(
                b.kv_bytes_per_sequence, plan.topology.device_kind)).total
    return prefill_memory(
        model, prompts=b.prompt_store_rows, width=b.max_prompt_len,
        # The store keeps every layer's prompt columns; a slot, a sliding layer's ring.
        store_bytes=b.prompt_store_rows * b.kv_bytes_per_sequence
        * kv_columns(model, b.max_prompt_len) / kv_columns(model, b.seq_len, ring=True),
        weights_bytes=rollout.bytes_per_device, query_heads=heads,
        rows=b.sequences_per_rollout_replica, response_len=b.response_len,
        retile_bytes=retile).total


def _split(role, name: str, dim: int) -> int:
    """Ways dimension `dim` of parameter `name` is split on `role`'s mesh."""
    axis = role.specs[name][dim]
    return 1 if axis is None else int(role.mesh[axis])

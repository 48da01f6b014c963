"""Memory estimates the layout passes size against. Stated, deliberately simple, conservative.

- Training state per parameter: the master parameter, its gradient and AdamW m and v, all in
  `model.param_dtype` (fp32: 16 B), and a frozen reference copy in the compute dtype when
  `algorithm.kl_coef > 0`. It must fit in `TRAIN_STATE_FRACTION` of a device. With LoRA
  (`algorithm.lora.rank > 0`): the frozen base in the compute dtype (also the reference) per
  parameter, plus 4 param-dtype values per adapter parameter.
- The train step (`train_step_memory`), what XLA allocates for the compiled step on one
  device, measured against `jit(...).lower(...).compile().memory_analysis()`
  (tests/test_memory_estimate.py) at Qwen3-0.6B widths:
    state        master parameters and both moments (arguments; the step donates them)
    gradients    one gradient; with micro-batches > 1 a second one, the accumulator
    embedding    tied embeddings: the lookup's V x D gradient, summed into the head's
    copies       compute-dtype weights: the output matrix (cast or FSDP-gathered, V x D)
                 and, under FSDP, two gathered layers
    activations  one micro-batch's rows, each (remat = block): the saved block inputs
                 (layers x L x D, compute dtype) plus the larger of one block's attention
                 (ATTENTION_SCORE_COPIES fp32 H x Q x L tensors for one block of Q queries
                 in XLA's backward; none with cuDNN's fused kernel) and the output head on the T response columns (the
                 kept T x V fp32 softmax, or HEAD_CHUNK_COPIES T x vocab_chunk chunks);
                 remat = none keeps every layer's working set (BLOCK_VALUES_PER_TOKEN
                 values per token) and scores
    batch        the step's token-aligned input arrays
  With LoRA (`adapters` > 0) the state, gradients and accumulator are the adapters' (param
  dtype, whole on every device); the frozen base is a further argument in the compute dtype
  (not donated; also the KL reference, so nothing else stays resident); it has no gradient,
  so neither the head's nor the tied lookup's V x D gradient is made, and its weights need no
  cast (copies: under FSDP only the gathered output matrix and two layers). Activations are
  unchanged: the adapters' x A intermediates are T x rank per target, small beside T x D
  (held with `tests/e2e/test_memory_estimate.py`'s LoRA cases and, on v5e,
  tests/e2e/test_aot_tpu.py; docs/lora.md has the figures).
  On a TPU the rows' buffers are the TPU compiler's (`TPU_ACTIVATIONS`, and a generation's
  `generations.TpuGeneration.head_kept_copies`: fitted to its own peak with `locojax.aot`,
  said there).
  The batching pass picks the fewest micro-batches whose step, beside what stays resident
  (the reference, none with LoRA, where the base is a step argument; not CO's rollout copy,
  which the trainer drops before the update and remakes after it), fits
  `TRAIN_STEP_FRACTION` of a device, then keeps the head's softmax when that still fits; the
  sharding pass widens FSDP groups until a one-row step fits. The supervised warm-up's step
  (one row per prompt, no reference resident yet) is split by the same rule.
- Rollout: weights (sharded by the rollout specs, compute dtype) may take
  `ROLLOUT_WEIGHT_SHARE` of the rollout budget (`ROLLOUT_FRACTION` of a device, less the
  training state in CO, where both live on the same devices). The engine holds the weights
  once on accelerators (layers scanned over the stacked weights) and twice on a CPU (its
  per-layer and output-matrix copies, made once per generation, which XLA:CPU runs faster),
  on a TPU7x a re-tiled copy of the embedding table (`embedding_relayout_bytes`) and, for
  multi-turn episodes, a re-laid copy of the running wave's keys
  (`episode_key_relayout_bytes`),
  the prompt KV store (each prompt's KV from the prefill, `prompt_store_rows` x
  max_prompt_len tokens, every layer) and, per slot, one sequence's KV (a sliding layer's
  window only where it keeps a ring: `kv_columns`) plus the platform's
  `SAMPLING_VALUES_PER_SLOT` fp32 values per vocabulary entry (logits and the sampler's
  temporaries) and, on a TPU scanning stacked caches without the decode kernel, one layer's
  re-laid K and V (`relaid_layer_kv_bytes`; the kernel reads each layer in place:
  `tpu_decode_kernel`); the slots are as many as that leaves room for (`rollout_bytes`).
- LoRA's rollout copy (CO, `lora_merge_bytes`): the trainer merges W + s A B in one program
  on the training shardings before the reshard places it: the base (compute dtype) and the
  adapters in, the merged copy of every weight out (compute dtype); the fp32 sums are fused
  (no temporaries on v5e). Held against that program's compiled peak with `locojax.aot` (its
  `reshard` report under LoRA). It is transient, like full fine-tuning's reshard: the rollout
  budget counts the training state and the placed rollout weights only.
Emulated CPU devices share one machine's RAM; the estimates still treat each as separate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from compiler.axes import MeshAxis
from compiler.config import AlgorithmConfig, ModelConfig
from compiler.generations import TPU_GENERATIONS
from compiler.params import ParamInfo, adapter_table, param_count, param_table
from compiler.vocab import DType, LoraWarmup

TRAIN_STATE_FRACTION = 0.75
"""Share of a trainer device the training state may take; the rest is activation headroom."""
ROLLOUT_FRACTION = 0.9
"""Share of a device the rollout (weights + KV cache) may use; the rest is XLA workspace."""
ROLLOUT_WEIGHT_SHARE = 0.5
"""Share of the rollout budget the weights may take; the KV cache gets the rest."""
TRAIN_STEP_FRACTION = 0.9
"""Share of a trainer device the train step and what stays resident may use (the rest:
XLA's workspace and fragmentation)."""
ATTENTION_SCORE_COPIES = 6
"""fp32 H x Q x L tensors one row's attention keeps live in XLA's backward (scores, masked
scores, exponentials, probabilities and two gradients; the CPU compiler at Qwen3-0.6B widths
peaks at 5-6), Q = min(L, ATTENTION_QUERY_BLOCK)."""
ATTENTION_QUERY_BLOCK = 512
"""Queries per block of the training attention (`locojax.model.attention.QUERY_BLOCK`)."""
HEAD_CHUNK_COPIES = 3
"""T x vocab_chunk fp32 buffers of the chunked log-prob head (logits, softmax, gradient)."""
HEAD_KEPT_COPIES = 2
"""T x V fp32 buffers of the head that keeps its softmax: the kept one and its gradient."""
BLOCK_VALUES_PER_TOKEN = (12, 6, 2)
"""Values one block keeps per token without remat: 12 D + 6 F + 2 (H + 2K) head_dim."""
VOCAB_CHUNK = 8192
"""The trainer's vocabulary chunk (`locojax.train.ForwardSettings.vocab_chunk`)."""
CPU_ROLLOUT_WEIGHT_COPIES = 2
"""On a CPU: the weights and the engine's copy of them (per-layer arrays, the output matrix);
elsewhere one."""
SAMPLING_VALUES_PER_SLOT = {"cpu": 10, "tpu": 3}
"""fp32 vocabulary-sized arrays per slot a decode step keeps live (logits, softmax weights,
cumulative sums), by platform: XLA:CPU's buffer sizes at Qwen3-0.6B widths, ~9.6; the TPU
compiler's buffer report of Gemma-3-1B's slot loop on v5e, 3 slots x V fp32 arrays (docs/
models.md). Another platform takes XLA:CPU's (`sampling_values_per_slot`)."""
TPU_STACKED_LAYER_KV = 1
"""Layers' K and V per slot that the TPU compiler keeps beside a stacked slot loop's caches
when XLA attends (the scanned layer's, sliced out and re-laid for the step's attention):
Qwen3-0.6B's slot loop on v5e grew 118.0 MiB a slot, 112 of its KV, 1.7 of sampler arrays
and ~4 of one layer's K and V (docs/models.md). Per-layer caches (a CPU, a sliding layer's
ring) and the TPU decode kernel (`tpu_decode_kernel`) read each layer in place."""
DECODE_KERNEL_COLUMNS = 128
"""The TPU decode kernel's column block (`locojax.kernels.tpu_decode.LANES`): it attends
over caches whose width is a multiple of it."""


def dtype_bytes(model: ModelConfig) -> int:
    """Bytes of one value in the compute dtype (activations, rollout weights, KV cache)."""
    return 2 if model.dtype == DType.bfloat16 else 4


def param_dtype_bytes(model: ModelConfig) -> int:
    """Bytes of one master parameter (and of its gradient and each AdamW moment)."""
    return 2 if model.param_dtype == DType.bfloat16 else 4


def train_state_bytes_per_param(model: ModelConfig, algorithm: AlgorithmConfig) -> int:
    """Bytes of training state per parameter (see module docstring); with LoRA the frozen
    base only, in the compute dtype (it is also the reference; the adapters are counted by
    `training_state_bytes`). A whole-model LoRA warm-up (`algorithm.lora.warmup=full`)
    holds full fine-tuning's master, gradient and moments first, without a reference."""
    lora = algorithm.lora
    if lora.rank > 0 and lora.warmup == LoraWarmup.full and algorithm.sft_warmup_steps > 0:
        return 4 * param_dtype_bytes(model)
    if lora.rank > 0:
        return dtype_bytes(model)
    reference = dtype_bytes(model) if algorithm.kl_coef > 0 else 0
    return 4 * param_dtype_bytes(model) + reference


def sharded_elements(table: tuple[ParamInfo, ...], specs: dict[str, tuple[MeshAxis | None, ...]],
                     mesh: dict[MeshAxis, int]) -> float:
    """Elements of all parameters one device holds under `specs` on `mesh`."""
    total = 0.0
    for p in table:
        split = prod(mesh[a] for a in specs[p.name] if a is not None)
        total += p.size / split
    return total


@dataclass(frozen=True)
class RowActivations:
    """Activation bytes of one sequence of a micro-batch, by phase of the backward pass."""

    stored: float
    """Kept from the forward for the whole backward: the blocks' inputs (remat = block) or
    every layer's working set and scores (remat = none)."""
    layer: float
    """One block's recomputed working set in its backward (its attention scores)."""
    head: float
    """The output head's buffers in its backward (T response columns)."""

    @property
    def peak(self) -> float:
        """What one row adds at its worst phase."""
        return self.stored + max(self.layer, self.head)


@dataclass(frozen=True)
class CompilerActivations:
    """How many activation buffers a platform's compiler keeps in the train step's backward."""

    score_copies: float = ATTENTION_SCORE_COPIES
    """fp32 H x Q x L attention tensors one row keeps (`ATTENTION_SCORE_COPIES`)."""
    head_kept_copies: float = HEAD_KEPT_COPIES
    """T x V fp32 buffers of the head that keeps its softmax (`HEAD_KEPT_COPIES`)."""
    stored_values: float = 1.0
    """Compute-dtype values per token x D per rematerialised block live through the layers'
    backward (1: the block's input, saved by the forward; more: what the compiler keeps
    besides while the blocks' backward runs, not during the head's)."""
    mlp_values: float = 0.0
    """Compute-dtype values per token x F (the MLP's width) one rematerialised block's
    backward keeps besides its attention tensors (0: the XLA:CPU-measured model, whose score
    copies cover them)."""


TPU_ACTIVATIONS = CompilerActivations(score_copies=3.0, mlp_values=16.0, head_kept_copies=1.6)
"""The TPU compiler's, fitted to its `memory_analysis()` peak for the GRPO train step (bf16
over fp32 masters, remat = block; libtpu 0.0.42.1, `locojax.aot`, docs/aot.md "The blocks'
backward at other widths"): 3 fp32 H x Q x L attention tensors and 16 compute-dtype values
per token x F per row. At Qwen3-0.6B's widths (F x 2 B x 16 = 3 score copies) this is the
XLA:CPU model's 6 score copies exactly; the split matters at other widths, where the MLP
grows and the heads do not: with the CPU constants the plan counted 0.75 of the compiler's
step for Qwen3-1.7B and 0.83 for Qwen3-4B on v7x. Over 22 compiled 28- and 36-layer steps
(Qwen3-0.6B with GSM8K's and NuminaMath-CoT's rows on v5e, v6e, v5p and v7x at 8 to 64
chips; Qwen3-1.7B and 4B on v7x) the plan is 0.92-1.24 of the compiler
(tests/compiler/test_tpu_step_memory.py). The early buffer assignment of those
steps holds ~4.5 score tensors, ~5 T x F products and T x D / T x H x head_dim buffers per
row, and the compiler's final peak is ~1.37x that assignment; the two constants stand for
all of it. The head that keeps its softmax holds 1.6 T x V fp32 buffers per row, not 2 (the
compiler's, from the 64-chip steps and the 2-layer step with 2 updates: 1.25 on v6e, 1.6 on
v5p; with 2 the plan counted v6e's 64-chip step 1.51 of the compiler's); TPU7x's compiler
keeps 1.7-1.8 (its `generations.TpuGeneration.head_kept_copies`)."""


def compiler_activations(platform: str, device_kind: str = "") -> CompilerActivations:
    """What `platform`'s compiler keeps (`TPU_ACTIVATIONS` on a TPU, with its generation's
    `head_kept_copies` where its record has one; the XLA:CPU-measured constants
    elsewhere)."""
    if platform != "tpu":
        return CompilerActivations()
    generation = TPU_GENERATIONS.get(device_kind)
    if generation is None or generation.head_kept_copies is None:
        return TPU_ACTIVATIONS
    return replace(TPU_ACTIVATIONS, head_kept_copies=generation.head_kept_copies)


def row_activations(model: ModelConfig, seq_len: int, response_len: int, *, remat: bool = True,
                    keep_probs: bool = False, fused_attention: bool = False,
                    platform: str = "cpu", device_kind: str = "") -> RowActivations:
    """Train step activations of one sequence (module docstring) on `platform`'s
    `device_kind`."""
    b, d, f, h = dtype_bytes(model), model.hidden, model.ffn, model.num_heads
    kept = compiler_activations(platform, device_kind)
    queries = min(seq_len, ATTENTION_QUERY_BLOCK)
    scores = 0 if fused_attention else kept.score_copies * h * queries * seq_len * 4
    columns = (kept.head_kept_copies * model.vocab if keep_probs
               else HEAD_CHUNK_COPIES * VOCAB_CHUNK)
    head = float(response_len * columns * 4)
    if remat:
        stored = float(model.num_layers * seq_len * d * b)
        block = kept.mlp_values * seq_len * f * b
        return RowActivations(stored, scores + block + stored * (kept.stored_values - 1), head)
    cd, cf, ch = BLOCK_VALUES_PER_TOKEN
    block = seq_len * (cd * d + cf * f + ch * (h + 2 * model.num_kv_heads) * model.head_dim)
    return RowActivations(float(model.num_layers * (block * b + scores)), 0.0, head)


def activation_bytes_per_row(model: ModelConfig, seq_len: int, response_len: int, *,
                             remat: bool = True, keep_probs: bool = False,
                             fused_attention: bool = False, platform: str = "cpu") -> float:
    """Train step activation bytes of one sequence at its worst phase (module docstring)."""
    return row_activations(model, seq_len, response_len, remat=remat, keep_probs=keep_probs,
                           fused_attention=fused_attention, platform=platform).peak


SPLASH_MAX_DEVICES = 1
"""Train meshes on which the plan picks splash attention: its peak memory is counted for one
chip (docs/aot.md); on larger meshes the TPU compiler's peak ran 26-28% over the plan's count
of it (gsm8k and numina on v5e:2x4), so they keep XLA's attention until that is modelled."""


def fused_attention(model: ModelConfig, platform: str, seq_len: int = 0,
                    devices: int = 1) -> bool:
    """Whether training attention runs a fused kernel that keeps no L x S scores: cuDNN's on a
    GPU, splash attention on a TPU (rows of a multiple of 128 tokens, `seq_len` 0: any; no
    sliding layers; a train mesh of at most `SPLASH_MAX_DEVICES` `devices`), in 16-bit
    compute."""
    if model.dtype != DType.bfloat16:
        return False
    if platform == "gpu":
        return True
    return (platform == "tpu" and seq_len % 128 == 0 and not sliding_layers(model)
            and devices <= SPLASH_MAX_DEVICES)


@dataclass(frozen=True)
class TrainStepMemory:
    """Bytes one trainer device needs for the compiled train step (module docstring)."""

    state: float
    """Master parameters and both AdamW moments (the step's donated arguments)."""
    accumulator: float
    """The summed gradient of the micro-batches (0 with one micro-batch)."""
    backward: float
    """The worst phase of one micro-batch's backward pass (`phases`)."""
    weight_copies: float
    """Compute-dtype or FSDP-gathered weights: the output matrix, two layers."""
    batch: float
    """The step's input arrays."""
    phases: dict[str, float]
    """Temporaries by phase: `head` (the head's weight gradient, its buffers, what the
    forward stored), `layers` (the gradient, what the forward stored, one block's working
    set), `end` (the gradient and, tied, the embedding lookup's second V x D gradient)."""
    activations: float
    """What one micro-batch's rows add at their worst phase (`RowActivations.peak`)."""
    frozen: float = 0.0
    """LoRA: the frozen base, a compute-dtype argument the step does not donate (0: full
    fine-tuning)."""

    @property
    def total(self) -> float:
        """What the compiled step allocates: arguments plus its worst phase."""
        return (self.state + self.frozen + self.accumulator + self.backward
                + self.weight_copies + self.batch)


def _weight_copies(model: ModelConfig, table: tuple[ParamInfo, ...], fsdp: int,
                   lora: bool) -> float:
    """Compute-dtype weights the step makes: the output matrix cast (master weights in
    another dtype) or FSDP-gathered, and under FSDP two gathered layers. A LoRA base is
    stored in the compute dtype: gathered under FSDP, never cast."""
    cb = dtype_bytes(model)
    cast = cb != param_dtype_bytes(model) and not lora
    copies = model.vocab * model.hidden * cb if (cast or fsdp > 1) else 0.0
    if fsdp > 1:
        layer = sum(p.size for p in table if p.name.startswith("layers/")) / model.num_layers
        copies += 2 * layer * cb
    return float(copies)


def train_step_memory(model: ModelConfig, *, params_per_device: float, fsdp: int,
                      batch_rows: int, micro_rows: int, micro_batches: int, seq_len: int,
                      response_len: int, remat: bool, keep_probs: bool,
                      fused_attention: bool, reference: bool = False,
                      behaviour: bool = True, rollout: bool = False, platform: str = "cpu",
                      device_kind: str = "", table: tuple[ParamInfo, ...] | None = None,
                      adapters: float = 0.0) -> TrainStepMemory:
    """The train step's bytes on one device: `batch_rows` rows of input, mini-batches of
    `micro_batches` micro-batches of `micro_rows` rows. `reference` / `behaviour` /
    `rollout`: the rows carry reference / behaviour / the sampler's own log-probs (the last
    for the behaviour weight, algorithm.rollout_correction != none; the warm-up's carry none). `table`:
    the model's parameter table when the caller has it (None: built here). `adapters`:
    LoRA's adapter elements on the device (0: full fine-tuning); `params_per_device` is then
    the frozen base's elements. `platform`, `device_kind`: whose compiler's buffers
    (`compiler_activations`)."""
    pb, lora = param_dtype_bytes(model), adapters > 0
    table = param_table(model) if table is None else table
    grads = (adapters if lora else params_per_device) * pb
    head_grad = 0.0 if lora else model.vocab * model.hidden * pb / fsdp
    row = row_activations(model, seq_len, response_len, remat=remat, keep_probs=keep_probs,
                          fused_attention=fused_attention, platform=platform,
                          device_kind=device_kind)
    stored = micro_rows * row.stored
    phases = {
        "head": head_grad + stored + micro_rows * row.head,
        "layers": grads + stored + micro_rows * row.layer,
        "end": grads + (head_grad if model.tie_embeddings else 0.0),
    }
    # tokens, positions (int32), valid, mask (bool), behaviour, sampler and reference
    # log-probs (fp32), the advantage (GRPO rows)
    logps = 4 * (int(behaviour) + int(rollout) + int(reference))
    batch_row = seq_len * (4 + 4 + 1 + 1 + logps) + (4 if behaviour else 0)
    return TrainStepMemory(
        state=3 * grads, accumulator=grads if micro_batches > 1 else 0.0,
        backward=max(phases.values()),
        weight_copies=_weight_copies(model, table, fsdp, lora),
        batch=float(batch_rows * batch_row), phases=phases,
        activations=micro_rows * row.peak,
        frozen=params_per_device * dtype_bytes(model) if lora else 0.0)


def sliding_layers(model: ModelConfig) -> int:
    """Layers of `model` that attend over its sliding window: all but every
    `sliding_pattern`-th (Gemma 3), none without a pattern."""
    p = model.sliding_pattern
    return model.num_layers - model.num_layers // p if p else 0


def kv_columns(model: ModelConfig, seq_len: float, ring: bool = False) -> float:
    """Cache columns of one `seq_len`-token sequence summed over the layers: `seq_len` each,
    or with `ring` (the rollout's slot loop: `locojax.rollout.layout.ring_columns`) a sliding
    layer's window where that is narrower."""
    window = model.sliding_window
    narrow = min(window, seq_len) if ring and window and sliding_layers(model) else seq_len
    return float((model.num_layers - sliding_layers(model)) * seq_len
                 + sliding_layers(model) * narrow)


def kv_bytes_per_sequence(model: ModelConfig, seq_len: float, kv_split: int,
                          kv_bytes: int | None = None, ring: bool = False) -> float:
    """KV-cache bytes of one sequence on one device, K/V heads split `kv_split` ways, each
    value `kv_bytes` bytes (default: the model dtype's); `ring` as in `kv_columns`."""
    b = dtype_bytes(model) if kv_bytes is None else kv_bytes
    per_column = 2 * model.num_kv_heads * model.head_dim * b
    return float(per_column * kv_columns(model, seq_len, ring) / kv_split)


def embedding_relayout_bytes(model: ModelConfig, device_kind: str, split: int) -> float:
    """Bytes of the re-tiled embedding copy one rollout device holds (the table split `split`
    ways, compute dtype); 0 where the compiler makes none
    (`TpuGeneration.embedding_relayout`)."""
    generation = TPU_GENERATIONS.get(device_kind)
    if generation is None or not generation.embedding_relayout:
        return 0.0
    return float(model.vocab * model.hidden * dtype_bytes(model) / split)


def rollout_weight_copies(platform: str) -> int:
    """Copies of the rollout weights the engine holds on `platform` (module docstring)."""
    return CPU_ROLLOUT_WEIGHT_COPIES if platform == "cpu" else 1


def sampling_values_per_slot(platform: str) -> int:
    """fp32 vocabulary-sized arrays a slot's decode step keeps on `platform`
    (`SAMPLING_VALUES_PER_SLOT`)."""
    return SAMPLING_VALUES_PER_SLOT.get(platform, SAMPLING_VALUES_PER_SLOT["cpu"])


def tpu_decode_kernel(platform: str, stacked: bool, tensor: int, columns: int,
                      head_dim: int = DECODE_KERNEL_COLUMNS) -> bool:
    """Whether the slot loop attends through the TPU decode kernel, which reads each layer's K
    and V in place from the stacked caches (`locojax.rollout.backend.tpu_kernels_unusable`
    and `tpu_stacked_attention`): TPU devices, stacked caches, one device per rollout replica
    (`tensor` 1), slots of a multiple of `DECODE_KERNEL_COLUMNS` cache `columns`, heads of a
    multiple of the same 128 lanes (`head_dim`)."""
    return (platform == "tpu" and stacked and tensor == 1
            and columns % DECODE_KERNEL_COLUMNS == 0 and head_dim % DECODE_KERNEL_COLUMNS == 0)


def relaid_layer_kv_bytes(model: ModelConfig, kv_per_slot: float, platform: str,
                          stacked: bool, kernel: bool = False) -> float:
    """Bytes a slot's decode step keeps beside its caches for one layer's re-laid K and V
    (`TPU_STACKED_LAYER_KV`): on a TPU whose slot loop scans stacked caches and slices the
    layer out for XLA's attention, else 0 (`kernel`: the decode kernel reads it in place,
    `tpu_decode_kernel`)."""
    if platform != "tpu" or not stacked or kernel:
        return 0.0
    return TPU_STACKED_LAYER_KV * kv_per_slot / model.num_layers


def rollout_bytes(weights: float, platform: str, store_bytes: float, slots: int,
                  kv_per_slot: float, vocab: int, relaid: float = 0.0) -> float:
    """Peak bytes of the rollout engine on one device of `platform` (see the module
    docstring): `rollout_weight_copies` of the weights, the store and the slots, each its
    KV, the sampler's arrays and `relaid` bytes (`relaid_layer_kv_bytes`)."""
    per_slot = kv_per_slot + sampling_values_per_slot(platform) * vocab * 4 + relaid
    return rollout_weight_copies(platform) * weights + store_bytes + slots * per_slot


def episode_key_relayout_bytes(kv_per_episode: float, device_kind: str) -> float:
    """Bytes of one episode's re-laid keys (half its K and V cache) that the compiler keeps
    beside the caches in a multi-turn wave's programs; 0 where it keeps none
    (`TpuGeneration.episode_key_relayout`)."""
    generation = TPU_GENERATIONS.get(device_kind)
    if generation is None or not generation.episode_key_relayout:
        return 0.0
    return kv_per_episode / 2


def adapter_elements(model: ModelConfig, algorithm: AlgorithmConfig) -> float:
    """LoRA's adapter parameters (0 at rank 0); every trainer device holds them all."""
    return float(sum(p.size for p in adapter_table(model, algorithm.lora)))


def training_state_bytes(model: ModelConfig, algorithm: AlgorithmConfig) -> float:
    """Bytes of one copy of the training state (`train_state_bytes_per_param` per parameter;
    with LoRA plus each adapter parameter's master copy, gradient and two moments)."""
    adapters = adapter_elements(model, algorithm)
    return float(param_count(model) * train_state_bytes_per_param(model, algorithm)
                 + adapters * 4 * param_dtype_bytes(model))


def lora_merge_bytes(model: ModelConfig, algorithm: AlgorithmConfig, table: tuple[ParamInfo, ...],
                     split: int) -> float:
    """Bytes of LoRA's merge program on one device, the base split `split` ways (module
    docstring): the base and the adapters in, the merged copy out."""
    base = sum(p.size for p in table) * dtype_bytes(model)
    return float(2 * base / split + adapter_elements(model, algorithm) * param_dtype_bytes(model))

"""Memory estimates the layout passes size against. Stated, deliberately simple, conservative.

- Training state per parameter: the parameter and its gradient in the model dtype, AdamW
  m and v in fp32 (8 B), an fp32 master copy when the model dtype is bf16 (4 B), and a
  frozen reference copy in the model dtype when `algorithm.kl_coef > 0`. It must fit in
  `TRAIN_STATE_FRACTION` of a device; the rest is the activation headroom.
- Training activations of one sequence of L tokens, with each decoder block rematerialised:
  the saved block inputs (layers x L x D), one block's live working set (about 12 D + 3 F +
  2 (H + 2K) head_dim values per token, plus H x L x L fp32 attention scores, assuming no
  fused attention kernel) and fp32 logits with their gradient (2 x L x V x 4 B).
- Rollout: weights (sharded by the rollout specs) may take `ROLLOUT_WEIGHT_SHARE` of the
  rollout budget (`ROLLOUT_FRACTION` of a device, less the training state in CO, where both
  live on the same devices). The engine holds the weights once on accelerators (layers
  scanned over the stacked weights) and twice on a CPU (its per-layer and output-matrix
  copies, made once per generation, which XLA:CPU runs faster), the prompt KV store (each
  prompt's KV from the prefill, `prompt_store_rows` x max_prompt_len tokens) and, per slot,
  one sequence's KV plus `SAMPLING_VALUES_PER_SLOT` fp32 values per vocabulary entry (logits
  and the sampler's temporaries); the slots are as many as that leaves room for (`rollout_bytes`).
Emulated CPU devices share one machine's RAM; the estimates still treat each as separate.
"""

from __future__ import annotations

from math import prod

from compiler.axes import MeshAxis
from compiler.config import AlgorithmConfig, ModelConfig
from compiler.params import ParamInfo, param_count

TRAIN_STATE_FRACTION = 0.75
"""Share of a trainer device the training state may take; the rest is activation headroom."""
ROLLOUT_FRACTION = 0.9
"""Share of a device the rollout (weights + KV cache) may use; the rest is XLA workspace."""
ROLLOUT_WEIGHT_SHARE = 0.5
"""Share of the rollout budget the weights may take; the KV cache gets the rest."""
CPU_ROLLOUT_WEIGHT_COPIES = 2
"""On a CPU: the weights and the engine's copy of them (per-layer arrays, the output matrix);
elsewhere one."""
SAMPLING_VALUES_PER_SLOT = 10
"""fp32 vocabulary-sized arrays per slot a decode step keeps live (logits, softmax weights,
cumulative sums; measured from XLA:CPU's buffer sizes at Qwen3-0.6B widths, ~9.6)."""


def dtype_bytes(model: ModelConfig) -> int:
    """Bytes of one parameter or activation value in the model dtype."""
    return 2 if model.dtype == "bfloat16" else 4


def train_state_bytes_per_param(model: ModelConfig, algorithm: AlgorithmConfig) -> int:
    """Bytes of training state per parameter (see module docstring)."""
    b = dtype_bytes(model)
    master = 4 if b == 2 else 0
    reference = b if algorithm.kl_coef > 0 else 0
    return b + b + 8 + master + reference


def sharded_elements(table: tuple[ParamInfo, ...], specs: dict[str, tuple[MeshAxis | None, ...]],
                     mesh: dict[MeshAxis, int]) -> float:
    """Elements of all parameters one device holds under `specs` on `mesh`."""
    total = 0.0
    for p in table:
        split = prod(mesh[a] for a in specs[p.name] if a is not None)
        total += p.size / split
    return total


def activation_bytes_per_row(model: ModelConfig, seq_len: int) -> float:
    """Training activation bytes of one sequence (see module docstring)."""
    b, d, f = dtype_bytes(model), model.hidden, model.ffn
    heads = model.num_heads + 2 * model.num_kv_heads
    saved_inputs = model.num_layers * seq_len * d * b
    block = seq_len * (12 * d + 3 * f + 2 * heads * model.head_dim) * b
    scores = model.num_heads * seq_len * seq_len * 4
    logits = 2 * seq_len * model.vocab * 4
    return float(saved_inputs + block + scores + logits)


def kv_bytes_per_sequence(model: ModelConfig, seq_len: int, kv_split: int,
                          kv_bytes: int | None = None) -> float:
    """KV-cache bytes of one sequence on one device, K/V heads split `kv_split` ways, each
    value `kv_bytes` bytes (default: the model dtype's)."""
    b = dtype_bytes(model) if kv_bytes is None else kv_bytes
    per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * b
    return float(per_token * seq_len / kv_split)


def rollout_weight_copies(platform: str) -> int:
    """Copies of the rollout weights the engine holds on `platform` (module docstring)."""
    return CPU_ROLLOUT_WEIGHT_COPIES if platform == "cpu" else 1


def rollout_bytes(weights: float, copies: int, store_bytes: float, slots: int,
                  kv_per_slot: float, vocab: int) -> float:
    """Peak bytes of the rollout engine on one device (see the module docstring)."""
    per_slot = kv_per_slot + SAMPLING_VALUES_PER_SLOT * vocab * 4
    return copies * weights + store_bytes + slots * per_slot


def training_state_bytes(model: ModelConfig, algorithm: AlgorithmConfig) -> float:
    """Bytes of one copy of the training state (`train_state_bytes_per_param` per parameter)."""
    return float(param_count(model) * train_state_bytes_per_param(model, algorithm))

"""FLOPs and bytes of a decoder, from its architecture numbers alone (no devices).

Counting rules (physics, not tuned constants):

- a multiply-accumulate is 2 FLOPs; a token's forward pass costs 2 x `matmul_params` FLOPs
  plus causal attention, 4 x layers x H x head_dim x t FLOPs at context position t (QK^T and
  AV), so a sequence of L tokens costs 2 x P_mm x L + 2 x layers x H x head_dim x L(L + 1);
- `matmul_params` leaves out the input embedding (a gather, not a matmul) unless the output
  layer reuses it (tied embeddings);
- the output head (vocab x hidden, tied or not) runs on the positions whose logits are used:
  training and scoring on the response columns, a prefill on its last token, so a sequence's
  forward charges it on `head_len` of its L positions;
- backward = 2 x forward, so a train forward + backward is 3 x forward (6 x params x tokens);
  with LoRA the frozen base computes no weight gradients, so its backward is 1 x its matmul
  forward (the activation gradients) and each adapter parameter costs 6 x tokens
  (`train_flops`); rematerialisation recompute is not counted (it lowers the achieved
  efficiency instead);
- the KV cache stores K and V, layers x K x head_dim values each, per token, in the model dtype.

Memory (training state per parameter, activations, the budgets a layout must fit) is the
compiler's own estimate in `compiler.cost.memory`, so the cost model and the plan agree.
"""

from __future__ import annotations

from compiler.config import DType, HardwareSpec, ModelConfig
from compiler.cost.memory import dtype_bytes
from compiler.params import param_count


def peak_flops(hw: HardwareSpec, model: ModelConfig) -> float:
    """Peak dense FLOP/s of one chip in the model's dtype."""
    return hw.peak_flops_bf16 if model.dtype == DType.bfloat16 else hw.peak_flops_fp32


def param_bytes(model: ModelConfig) -> float:
    """Bytes of one full copy of the weights in the model dtype."""
    return float(param_count(model) * dtype_bytes(model))


def matmul_params(model: ModelConfig) -> int:
    """Parameters a token multiplies through: all but an untied input embedding."""
    embed = model.vocab * model.hidden
    return param_count(model) - (0 if model.tie_embeddings else embed)


def _matmul_flops(model: ModelConfig, seq_len: int, head_len: int | None) -> float:
    """Weight-matmul FLOPs of a forward over `seq_len` tokens with the head on the last
    `head_len` (None: all)."""
    skipped = 0 if head_len is None else seq_len - head_len
    return 2.0 * (matmul_params(model) * seq_len - model.vocab * model.hidden * skipped)


def forward_flops(model: ModelConfig, seq_len: int, head_len: int | None = None) -> float:
    """FLOPs of one causal forward pass over a sequence of `seq_len` tokens, the output head
    on the last `head_len` of them (None: every one)."""
    attn = 2.0 * model.num_layers * model.num_heads * model.head_dim * seq_len * (seq_len + 1)
    return _matmul_flops(model, seq_len, head_len) + attn


def train_flops(model: ModelConfig, seq_len: int, adapters: float = 0.0,
                head_len: int | None = None) -> float:
    """FLOPs of one train forward + backward over a sequence of `seq_len` tokens whose loss is
    on the last `head_len` (the response columns; None: every one): 3 x forward. With LoRA
    (`adapters` > 0 adapter parameters) the frozen base's weight gradients, its weight matmuls'
    forward FLOPs again, are not computed, and the adapters cost 6 x adapters x L."""
    full = 3.0 * forward_flops(model, seq_len, head_len)
    if adapters <= 0:
        return full
    return full - _matmul_flops(model, seq_len, head_len) + 6.0 * adapters * seq_len


def prefill_flops(model: ModelConfig, seq_len: int) -> float:
    """FLOPs of a rollout prefill of `seq_len` prompt tokens: every layer on every token, the
    output projection on the last one only (the engine samples from it alone)."""
    return forward_flops(model, seq_len, head_len=1)


def decode_token_flops(model: ModelConfig, context: float) -> float:
    """FLOPs of generating one token of one sequence that attends to `context` positions."""
    attn = 4.0 * model.num_layers * model.num_heads * model.head_dim * context
    return 2.0 * matmul_params(model) + attn


def kv_bytes_per_token(model: ModelConfig) -> float:
    """KV-cache bytes of one token (all layers, K and V)."""
    return 2.0 * model.num_layers * model.num_kv_heads * model.head_dim * dtype_bytes(model)

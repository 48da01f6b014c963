"""The rollout prefill's memory (`compiler.cost.prefill`): each term by hand at Qwen3-0.6B
widths, how they scale, and the TPU7x's re-tiled weights (docs/aot.md: measured against the
TPU compiler's buffer assignments)."""

import pytest
from compiler_cases import make_config

from compiler.axes import MeshAxis
from compiler.cost.memory import kv_bytes_per_sequence
from compiler.cost.prefill import prefill_memory, retiled_weight_bytes
from compiler.params import param_table

QWEN = make_config(model="qwen3_0_6b", workload="gsm8k", hardware="v7x",
                   mesh={"kind": "tpu", "chips": 8}).model
W, T = 256, 768
"""GSM8K's prompt columns and response tokens."""
MESH = {MeshAxis.REPLICA: 8, MeshAxis.TENSOR: 1}


def _prefill(prompts=48, width=W, kv_bytes=None, heads=None, model=QWEN, retile=0.0):
    store = prompts * kv_bytes_per_sequence(model, width, 1, kv_bytes)
    return prefill_memory(model, prompts=prompts, width=width, store_bytes=store,
                          weights_bytes=1e9, query_heads=heads or model.num_heads,
                          rows=prompts * 8, response_len=T, retile_bytes=retile)


def test_gsm8k_prefill_on_one_v5e_device_by_hand():
    m = _prefill()
    assert (QWEN.num_layers, QWEN.num_heads, QWEN.num_kv_heads, QWEN.head_dim,
            QWEN.hidden) == (28, 16, 8, 128, 1024)
    store = 48 * 28 * 2 * 8 * 128 * W * 2  # prompts x layers x (K, V) x heads x hd x W, bf16
    assert m.store == store == 1_409_286_144
    assert m.key_relayout == store / 2  # the keys' loop layout, copied into the store's
    assert m.attention == 48 * (2 * 16 * W * W * 4 + W * 1024 * 2)  # 2 fp32 scores + hidden
    assert m.uniforms == 48 * 8 * T * 2 * 4
    assert m.retile == 0.0
    assert m.total == pytest.approx(1e9 + 1.5 * store + m.attention + m.uniforms)


def test_terms_scale_with_prompts_width_heads_and_kv_dtype():
    base = _prefill()
    double = _prefill(prompts=96)
    assert double.attention == 2 * base.attention and double.store == 2 * base.store
    wide = _prefill(width=2 * W)
    hidden = 48 * W * QWEN.hidden * 2
    assert wide.attention - 2 * hidden == pytest.approx(4 * (base.attention - hidden))
    assert wide.store == 2 * base.store
    # Tensor parallel 2: half the query heads' scores on a device; the hidden stays whole.
    half = _prefill(heads=QWEN.num_heads // 2)
    assert half.attention - hidden == pytest.approx((base.attention - hidden) / 2)
    # An fp32 KV store doubles the store and its keys' relayout copy.
    fp32 = _prefill(kv_bytes=4)
    assert fp32.store == 2 * base.store and fp32.key_relayout == 2 * base.key_relayout
    assert fp32.weights == base.weights and fp32.attention == base.attention


def _specs(split: dict[str, int] | None = None) -> dict:
    """Replicated rollout specs, or tensor on dimension `split[name]` of the named params."""
    split = split or {}
    return {p.name: tuple(MeshAxis.TENSOR if i == split.get(p.name) else None
                          for i in range(len(p.shape))) for p in param_table(QWEN)}


def test_tpu7x_retiles_o_proj_and_the_mlp_only():
    n, d, f, h, hd = (QWEN.num_layers, QWEN.hidden, QWEN.ffn, QWEN.num_heads,
                      QWEN.head_dim)
    expected = (n * h * hd * d + 3 * n * d * f) * 2  # o_proj, gate, up, down in bf16
    assert retiled_weight_bytes(QWEN, "TPU7x", _specs(), MESH) == expected == 645_922_816
    for kind in ("TPU v5 lite", "TPU v5", "TPU v6 lite", "cpu"):
        assert retiled_weight_bytes(QWEN, kind, _specs(), MESH) == 0.0
    tensor = {MeshAxis.REPLICA: 4, MeshAxis.TENSOR: 2}
    sharded = _specs({"layers/attn/o_proj": 1, "layers/mlp/gate_proj": 2,
                      "layers/mlp/up_proj": 2, "layers/mlp/down_proj": 1,
                      "layers/attn/q_proj": 2})
    assert retiled_weight_bytes(QWEN, "TPU7x", sharded, tensor) == expected / 2
    assert _prefill(retile=expected).total - _prefill().total == expected

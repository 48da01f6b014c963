"""A Hugging Face Qwen3 directory read with `tokenizers` and `safetensors` alone, and decoded
greedily by a float64 numpy forward written from HF's Qwen3 (not from our model): the export
round trip's independent reader (transformers is only in the peers' venv).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tokenizers
from safetensors.numpy import load_file

NEAR_TIE = 1e-4
"""A greedy step whose two best logits are closer than this may round either way."""


@dataclass(frozen=True)
class HfDir:
    """What an HF consumer reads from the directory."""

    config: dict
    weights: dict[str, np.ndarray]
    tokenizer: tokenizers.Tokenizer
    tokenizer_config: dict
    generation: dict

    @classmethod
    def read(cls, root: Path) -> HfDir:
        def js(name: str) -> dict:
            return json.loads((root / name).read_text())

        weights = {k: v.astype(np.float64) for k, v in load_file(root / "model.safetensors").items()}
        return cls(js("config.json"), weights, tokenizers.Tokenizer.from_file(
            str(root / "tokenizer.json")), js("tokenizer_config.json"),
            js("generation_config.json"))


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x_LxHxE: np.ndarray, theta: float) -> np.ndarray:
    """HF's rotate_half RoPE at positions 0..L-1."""
    length, _, e = x_LxHxE.shape
    inv = 1.0 / theta ** (np.arange(0, e, 2) / e)
    ang = np.arange(length)[:, None] * inv[None]
    cos, sin = (np.concatenate([f(ang)] * 2, -1)[:, None] for f in (np.cos, np.sin))
    rotated = np.concatenate([-x_LxHxE[..., e // 2:], x_LxHxE[..., :e // 2]], -1)
    return x_LxHxE * cos + rotated * sin


def logits(hf: HfDir, ids: list[int]) -> np.ndarray:
    """Next-token logits after every position of `ids` (L x V)."""
    c, w = hf.config, hf.weights
    eps, n = c["rms_norm_eps"], len(ids)
    heads, kv, e = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    theta = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta"))
    x = w["model.embed_tokens.weight"][ids]
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q, k, v = ((h @ w[p + f"self_attn.{m}_proj.weight"].T).reshape(n, -1, e)
                   for m in "qkv")
        q = _rope(_rms(q, w[p + "self_attn.q_norm.weight"], eps), theta)
        k = np.repeat(_rope(_rms(k, w[p + "self_attn.k_norm.weight"], eps), theta),
                      heads // kv, axis=1)
        v = np.repeat(v, heads // kv, axis=1)
        s = np.einsum("qhe,khe->hqk", q, k) / np.sqrt(e) + causal
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("hqk,khe->qhe", a, v).reshape(n, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    return _rms(x, w["model.norm.weight"], eps) @ head.T


def greedy(hf: HfDir, prompt: str, max_new_tokens: int) -> tuple[list[int], list[float]]:
    """(greedy completion ids, each step's gap between its two best logits), stopping after
    an id of generation_config's `eos_token_id` (not kept) as HF `generate` does."""
    ids = hf.tokenizer.encode(prompt, add_special_tokens=False).ids
    stops = hf.generation["eos_token_id"]
    stops = set(stops if isinstance(stops, list) else [stops])
    out: list[int] = []
    gaps: list[float] = []
    for _ in range(max_new_tokens):
        last = logits(hf, ids + out)[-1]
        top2 = np.sort(last)[-2:]
        gaps.append(float(top2[1] - top2[0]))
        token = int(np.argmax(last))
        if token in stops:
            break
        out.append(token)
    return out, gaps


def same_greedy(ours: list[int], ref: list[int], gaps: list[float]) -> bool:
    """Equal, or equal up to a step whose two best logits were a near tie."""
    if ours == ref:
        return True
    first = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b),
                 min(len(ours), len(ref)))  # else one stopped where the other went on
    return first < len(gaps) and gaps[first] < NEAR_TIE

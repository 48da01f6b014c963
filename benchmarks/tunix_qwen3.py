"""tunix's Qwen3 `ModelConfig` from an HF checkpoint's config.json (the peers' venv only):
one mapping of the HF field names for every benchmark that runs tunix."""

from __future__ import annotations

import json
from pathlib import Path


def tunix_config(checkpoint: Path):
    """`tunix.models.qwen3.model.ModelConfig` of the checkpoint directory `checkpoint`."""
    from tunix.models.qwen3 import model as model_lib

    cfg = json.loads((Path(checkpoint) / "config.json").read_text())
    return model_lib.ModelConfig(
        num_layers=cfg["num_hidden_layers"], vocab_size=cfg["vocab_size"],
        embed_dim=cfg["hidden_size"], hidden_dim=cfg["intermediate_size"],
        num_heads=cfg["num_attention_heads"], head_dim=cfg["head_dim"],
        num_kv_heads=cfg["num_key_value_heads"], rope_theta=int(cfg["rope_theta"]),
        norm_eps=cfg["rms_norm_eps"], use_tied_embedding=cfg["tie_word_embeddings"],
    )

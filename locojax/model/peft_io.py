"""LoRA adapters in PEFT's layout: `adapter_model.safetensors` + `adapter_config.json`.

    export_peft_adapters(spec, adapters {path: {'a', 'b'}} numpy, out_dir, base) -> out_dir

PEFT's Linear keeps lora_A.weight (r, in_features) and lora_B.weight (out_features, r) and
computes W x + (alpha / r) B A x; ours is x W + (alpha / r) (x A) B with A (in..., r) and
B (r, out...), per layer. So lora_A = A flattened to (in, r) and transposed, lora_B = B
flattened to (r, out) and transposed; the flattening order is the one `hf_io` uses for the
weights (q/k/v: out = (heads, head_dim); o: in = (heads, head_dim)), so PEFT's merge equals
our merged export. Keys: base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from locojax.model.lora import LoraSpec

PEFT_MODULES = {
    "layers/attn/q_proj": "self_attn.q_proj", "layers/attn/k_proj": "self_attn.k_proj",
    "layers/attn/v_proj": "self_attn.v_proj", "layers/attn/o_proj": "self_attn.o_proj",
    "layers/mlp/gate_proj": "mlp.gate_proj", "layers/mlp/up_proj": "mlp.up_proj",
    "layers/mlp/down_proj": "mlp.down_proj",
}
"""Our stacked weight -> its module under `model.layers.{i}.` in transformers' Qwen3."""


def peft_tensors(spec: LoraSpec, adapters: dict) -> dict[str, np.ndarray]:
    """PEFT key -> tensor, one pair per layer and target."""
    out = {}
    for path, ad in adapters.items():
        a, b = np.asarray(ad["a"]), np.asarray(ad["b"])
        module = PEFT_MODULES[path]
        for i in range(a.shape[0]):
            key = f"base_model.model.model.layers.{i}.{module}"
            out[f"{key}.lora_A.weight"] = np.ascontiguousarray(
                a[i].reshape(-1, spec.rank).T)
            out[f"{key}.lora_B.weight"] = np.ascontiguousarray(
                b[i].reshape(spec.rank, -1).T)
    return out


def adapter_config(spec: LoraSpec, base: str | None) -> dict:
    """PEFT's LoraConfig as JSON: rank, alpha, the targets by their HF module names."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
        "r": spec.rank, "lora_alpha": spec.alpha, "lora_dropout": 0.0, "bias": "none",
        "target_modules": sorted(PEFT_MODULES[p].rsplit(".", 1)[1] for p in spec.paths),
        "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
        "inference_mode": True, "modules_to_save": None,
    }


def export_peft_adapters(spec: LoraSpec, adapters: dict, out_dir: Path,
                         base: str | None = None) -> Path:
    """Write `adapters` (numpy, any float dtype) as PEFT loads them; returns `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(peft_tensors(spec, adapters), str(out_dir / "adapter_model.safetensors"))
    (out_dir / "adapter_config.json").write_text(json.dumps(adapter_config(spec, base),
                                                            indent=1) + "\n")
    return out_dir

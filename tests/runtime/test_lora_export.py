"""LoRA export and resume: PEFT's keys, shapes and config, PEFT's merge equals our merged
export, and a checkpoint's adapters are refused on another base. (`peft` is not installed
here, so this checks the layout PEFT reads, not PEFT itself.)"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from locojax.model import ModelArch, Qwen3, export_hf_checkpoint, split_params
from locojax.model.lora import LoraSpec, merged
from locojax.model.peft_io import export_peft_adapters
from locojax.runtime.adapters import BASE_FINGERPRINT, check_base, fingerprint
from locojax.runtime.errors import ResumeRefused
from locojax.train.lora import init_adapter_state

ARCH = ModelArch(num_layers=2, hidden=16, num_heads=4, num_kv_heads=2, head_dim=8, ffn=24,
                 vocab=40)
SPEC = LoraSpec(rank=4, alpha=8.0, targets=("q", "o", "gate", "down"))


def _adapters():
    return jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(3), x.shape),
                        init_adapter_state(ARCH, SPEC, seed=0))


def test_peft_layout_keys_shapes_config_and_merge(tmp_path):
    _, base = split_params(Qwen3(ARCH, rngs=nnx.Rngs(0)))
    adapters = _adapters()
    out = export_peft_adapters(SPEC, jax.tree.map(np.asarray, adapters), tmp_path / "lora",
                               "Qwen/Qwen3-0.6B")
    tensors = load_file(str(out / "adapter_model.safetensors"))
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
    assert config["target_modules"] == ["down_proj", "gate_proj", "o_proj", "q_proj"]
    d, h, hd, f, r = ARCH.hidden, ARCH.num_heads, ARCH.head_dim, ARCH.ffn, SPEC.rank
    want = {"self_attn.q_proj": ((r, d), (h * hd, r)), "self_attn.o_proj": ((r, h * hd), (d, r)),
            "mlp.gate_proj": ((r, d), (f, r)), "mlp.down_proj": ((r, f), (d, r))}
    keys = {f"base_model.model.model.layers.{i}.{m}.lora_{ab}.weight": shape
            for i in range(ARCH.num_layers) for m, shapes in want.items()
            for ab, shape in zip("AB", shapes, strict=True)}
    assert {k: v.shape for k, v in tensors.items()} == keys
    # PEFT's merge, W + (alpha / r) B A in torch layout, equals our merged HF export.
    export_hf_checkpoint(ARCH, base, tmp_path / "base")
    export_hf_checkpoint(ARCH, merged(base, adapters, SPEC, jnp.float32), tmp_path / "merged")
    w0 = load_file(str(tmp_path / "base" / "model.safetensors"))
    w1 = load_file(str(tmp_path / "merged" / "model.safetensors"))
    for key in keys:
        if ".lora_A." not in key:
            continue
        name = key.removeprefix("base_model.model.").replace(".lora_A", "")
        peft = w0[name] + SPEC.scale * tensors[key.replace("lora_A", "lora_B")] @ tensors[key]
        np.testing.assert_allclose(peft, w1[name], rtol=1e-5, atol=1e-6)


def test_resume_on_another_base_is_refused(tmp_path):
    _, base = split_params(Qwen3(ARCH, rngs=nnx.Rngs(0)))
    _, other = split_params(Qwen3(ARCH, rngs=nnx.Rngs(1)))
    meta = {BASE_FINGERPRINT: fingerprint(base)}
    check_base(meta, base, tmp_path)  # the same base: resumes
    check_base({}, other, tmp_path)  # a full fine-tuning checkpoint records none
    with pytest.raises(ResumeRefused) as err:
        check_base(meta, other, tmp_path)
    assert "\n" not in str(err.value) and "another base" in str(err.value)

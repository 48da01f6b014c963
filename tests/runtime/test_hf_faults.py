"""Faults of Hugging Face checkpoints: each is one `CheckpointError` line naming the file and
the tensor, with expected and found shapes; exports leave no temporary file behind."""

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
from paths import FIXTURES
from safetensors.numpy import load_file, save_file

from locojax.model import CheckpointError, export_hf_checkpoint, load_hf_checkpoint

DOWN0 = "model.layers.0.mlp.down_proj.weight"
Q0 = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture
def ckpt(tmp_path) -> Path:
    """A writable copy of the untied single-file fixture (2 layers, hidden 64, ffn 128)."""
    return Path(shutil.copytree(FIXTURES / "tiny_qwen3", tmp_path / "ckpt"))


def _edit(ckpt: Path, change) -> None:
    tensors = load_file(ckpt / "model.safetensors")
    change(tensors)
    save_file(tensors, ckpt / "model.safetensors")


def _fault(ckpt: Path) -> str:
    with pytest.raises(CheckpointError) as err:
        load_hf_checkpoint(ckpt)
    text = str(err.value)
    assert "\n" not in text
    return text


def test_missing_tensor_is_named_as_missing_with_its_shape(ckpt):
    _edit(ckpt, lambda t: t.pop(DOWN0))
    text = _fault(ckpt)
    assert f"tensor {DOWN0} is missing (expected shape (64, 128))" in text
    assert str(ckpt / "model.safetensors") in text and "layers.1" not in text


def test_extra_tensor_is_named(ckpt):
    _edit(ckpt, lambda t: t.update({"model.layers.7.mlp.gate_proj.weight":
                                    np.zeros((128, 64), np.float32)}))
    text = _fault(ckpt)
    assert "model.layers.7.mlp.gate_proj.weight (shape (128, 64)) is not a qwen3 tensor" in text


def test_wrong_shape_names_tensor_found_and_expected(ckpt):
    _edit(ckpt, lambda t: t.update({Q0: t[Q0][:, :32].copy()}))
    text = _fault(ckpt)
    assert f"{ckpt / 'model.safetensors'}: tensor {Q0} has shape (64, 32), expected (64, 64)" \
        in text


def test_config_that_disagrees_with_the_tensors(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "hidden_size": 32}))
    text = _fault(ckpt)
    assert "model.embed_tokens.weight has shape (512, 64), expected (512, 32)" in text
    assert "more)" in text  # every tensor of width 64 is wrong: the count is given


def test_truncated_file_is_named(ckpt):
    path = ckpt / "model.safetensors"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    assert _fault(ckpt).startswith(f"{path}: not a complete safetensors file")


@pytest.mark.parametrize("text,why", [("{not json", "not JSON"), ("[1, 2]", "not a JSON object"),
                                      ('{"model_type": "qwen9"}', "model_type='qwen9' is not supported")])
def test_bad_config_json_is_named(ckpt, text, why):
    (ckpt / "config.json").write_text(text)
    assert _fault(ckpt).startswith(f"{ckpt / 'config.json'}: {why}")


def test_missing_config_and_missing_weights(ckpt):
    (ckpt / "model.safetensors").unlink()
    assert "neither model.safetensors nor" in _fault(ckpt)
    (ckpt / "config.json").unlink()
    assert _fault(ckpt) == f"{ckpt / 'config.json'}: no such file"


def test_sharded_index_naming_a_missing_shard(tmp_path):
    ckpt = Path(shutil.copytree(FIXTURES / "tiny_qwen3_tied_sharded", tmp_path / "ckpt"))
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    text = _fault(ckpt)
    assert text == (f"{ckpt / 'model.safetensors.index.json'}: lists "
                    "model-00002-of-00002.safetensors, which is missing")


def test_non_finite_weights_are_refused(ckpt):
    def poison(t):
        t[DOWN0] = t[DOWN0].copy()
        t[DOWN0][3, 5] = np.nan
    _edit(ckpt, poison)
    assert f"tensor {DOWN0} has 1 non-finite values" in _fault(ckpt)


def test_export_leaves_no_temporary_file_and_ordinary_permissions(tmp_path):
    arch, params = load_hf_checkpoint(FIXTURES / "tiny_qwen3")
    out = tmp_path / "hf"
    out.mkdir()
    (out / ".tmpABC123").write_bytes(b"x" * 100)  # what a killed export leaves behind
    umask = os.umask(0o022)
    try:
        export_hf_checkpoint(arch, params, out)
    finally:
        os.umask(umask)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    for p in out.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
    load_hf_checkpoint(out)

"""Issue 62, item 5: a checkpoint's numbers, tensors and tokenizer out of what a model can be.
A config.json with absurd values (a hundred thousand layers, a negative vocabulary, a head count
that does not divide) is one line naming the key before any tensor is read (here: with a
model.safetensors that would not even open); a tensor of the wrong dtype is one line naming it;
a tokenizer.json that does not parse, or whose ids exceed the vocabulary, is one line naming
it (also through `python -m locojax`: scripts/bad_inputs.py hf7). Shapes:
tests/runtime/test_hf_faults.py."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from paths import FIXTURES
from safetensors.numpy import load_file, save_file

from compiler.model_entry import model_numbers
from locojax.model import CheckpointError, load_hf_checkpoint
from locojax.tokenizers.char import load_char
from locojax.tokenizers.hf_dir import save_checkpoint_tokenizer
from locojax.tokenizers.load import load_tokenizer

Q0 = "model.layers.0.self_attn.q_proj.weight"
ABSURD = [
    ({"num_hidden_layers": 100_000}, "num_hidden_layers=100000: must be in [1, 1,024]"),
    ({"vocab_size": -5}, "vocab_size=-5: must be in [1, "),
    ({"hidden_size": 0}, "hidden_size=0: must be in [1, "),
    ({"intermediate_size": 10 ** 10}, "intermediate_size=10000000000: must be in [1, "),
    ({"head_dim": 0}, "head_dim=0: must be in [1, "),
    ({"num_attention_heads": 3}, "num_attention_heads=3: must be a multiple of "
                                 "num_key_value_heads=2"),
    ({"num_key_value_heads": 0}, "num_key_value_heads=0: must be in [1, "),
    ({"head_dim": None, "hidden_size": 66}, "hidden_size=66: must be a multiple of "
                                            "num_attention_heads=4 when config.json has no "
                                            "head_dim"),
    ({"max_position_embeddings": -3}, "max_position_embeddings=-3: must be in [1, "),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps=-1.0: must be a positive number below 1"),
    ({"rope_theta": 0}, "rope_theta=0: must be a positive number"),
]


@pytest.fixture
def ckpt(tmp_path) -> Path:
    return Path(shutil.copytree(FIXTURES / "tiny_qwen3", tmp_path / "ckpt"))


@pytest.mark.parametrize("change,says", ABSURD)
def test_an_absurd_config_number_is_one_line_naming_the_key_before_any_tensor(ckpt, change,
                                                                              says):
    config = json.loads((ckpt / "config.json").read_text()) | change
    (ckpt / "config.json").write_text(json.dumps(config))
    (ckpt / "model.safetensors").write_bytes(b"not a safetensors file")  # never opened
    with pytest.raises(CheckpointError) as err:
        load_hf_checkpoint(ckpt)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{ckpt / 'config.json'}: {says}"), line
    with pytest.raises(ValueError, match=f"^{says[:20]}"):  # the compiler reads it alike
        model_numbers(config)


@pytest.mark.parametrize("dtype", ["int32", "uint8", "bool", "int64"])
def test_a_tensor_of_a_dtype_no_weight_has_is_one_line_naming_it(ckpt, dtype):
    tensors = load_file(ckpt / "model.safetensors")
    tensors[Q0] = tensors[Q0].astype(dtype)
    save_file(tensors, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        load_hf_checkpoint(ckpt)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{ckpt / 'model.safetensors'}: tensor {Q0} "
                                                "is stored as ")
    assert "not a floating-point dtype" in line


def test_a_float16_tensor_in_a_float32_checkpoint_is_read(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    tensors[Q0] = tensors[Q0].astype(np.float16)
    save_file(tensors, ckpt / "model.safetensors")
    load_hf_checkpoint(ckpt)  # another float: cast as it is read


def _tokenizer_past(tmp_path: Path, edit) -> Path:
    save_checkpoint_tokenizer(load_char(), tmp_path)
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    edit(data)
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    return tmp_path


def test_a_tokenizer_whose_ids_exceed_the_vocabulary_is_one_line(tmp_path):
    """29 tokens fit a vocabulary of 32 by their count; one of them has id 5000. (An added
    token's id past the others is renumbered by `tokenizers` as it loads.)"""
    root = _tokenizer_past(tmp_path, lambda d: d["model"]["vocab"].update(Z=5000))
    with pytest.raises(ValueError) as err:
        load_tokenizer("checkpoint", checkpoint_dir=root, vocab_size=32)
    assert str(err.value) == (f"tokenizer {str(root)!r}: token 'Z' has id 5000, past the "
                              "model's vocab_size 32")


def test_a_stop_id_past_the_vocabulary_is_one_line(tmp_path):
    root = _tokenizer_past(tmp_path, lambda d: None)
    gen = json.loads((root / "generation_config.json").read_text())
    (root / "generation_config.json").write_text(json.dumps(gen | {"eos_token_id": [2, 77]}))
    with pytest.raises(ValueError, match="its stop id 77 is outside the model's vocab_size 32"):
        load_tokenizer("checkpoint", checkpoint_dir=root, vocab_size=32)


@pytest.mark.parametrize("text", ["{oops", "", "[1, 2]", '{"model": 7}'],
                         ids=["not JSON", "empty", "list", "wrong model"])
def test_a_tokenizer_json_that_does_not_parse_is_one_line_naming_it(tmp_path, text):
    root = _tokenizer_past(tmp_path, lambda d: None)
    (root / "tokenizer.json").write_text(text)
    with pytest.raises(ValueError) as err:
        load_tokenizer("checkpoint", checkpoint_dir=root, vocab_size=32)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{root / 'tokenizer.json'}: ")

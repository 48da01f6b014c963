"""`model.checkpoint` in the compiler: `model=hf` takes its numbers from config.json (plain
Python, no JAX), and any other entry whose numbers differ is rejected in one keyed line."""

import json
import shutil
import sys

import pytest
import warm
from paths import FIXTURES, ROOT

from compiler import PlanError, compile_plan
from compiler.model_entry import model_numbers, read_config
from locojax.config.compose import compose_config

FIXTURE = FIXTURES / "tiny_qwen3"
# model=tiny with every number of the fixture (tests/fixtures/make_hf_fixture.py)
FIXTURE_NUMBERS = ["model.num_layers=2", "model.hidden=64", "model.num_heads=4",
                   "model.num_kv_heads=2", "model.head_dim=16", "model.ffn=128",
                   "model.vocab=512", "model.tie_embeddings=false", "model.rope_theta=10000",
                   "model.max_position=512"]


def _compile(*overrides):
    # the fixture's 512-id vocabulary takes the char tokenizer (the range rule: vocab >= ids)
    return compile_plan(compose_config(["model.dtype=float32", "mesh=cpu", "model.tokenizer=char",
                                  *overrides]))


def test_model_hf_takes_every_number_from_config_json():
    plan = _compile("model=hf", f"model.checkpoint={FIXTURE}")
    model = plan.model.config
    numbers = model_numbers(read_config(FIXTURE))
    assert {k: getattr(model, k) for k in numbers} == numbers
    assert (model.num_layers, model.hidden, model.vocab, model.tie_embeddings) == (2, 64, 512,
                                                                                 False)
    # 512 x 64 embedding and head, 2 layers of 4 x 16 q, 2 x 16 k/v, 128-wide MLP, norms
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64 + 2 * 16
    assert plan.model.param_count == 2 * 512 * 64 + 2 * per_layer + 64


def test_model_hf_without_a_checkpoint_names_the_key():
    with pytest.raises(PlanError, match=r"^model.checkpoint=None: model=hf takes its numbers"):
        _compile("model=hf")


def test_an_entry_equal_to_the_checkpoint_compiles():
    plan = _compile(*FIXTURE_NUMBERS, f"model.checkpoint={FIXTURE}")
    assert plan.model.config.name == "tiny" and plan.model.config.num_layers == 2


def test_a_checkpoint_whose_num_layers_differs_gives_one_keyed_line(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**config,
                                                               "num_hidden_layers": 3}))
    out = warm.run(
        [sys.executable, "-m", "locojax", "model.dtype=float32", *FIXTURE_NUMBERS,
         f"model.checkpoint={tmp_path / 'ckpt'}", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0] == (f"error: model.checkpoint={tmp_path / 'ckpt'}: its config.json differs "
                        "from the model entry: num_layers 3 (checkpoint) vs 2 (model=tiny) "
                        "(model=hf takes the checkpoint's numbers)")


def test_every_differing_field_is_named_with_both_values():
    with pytest.raises(PlanError) as err:
        _compile(f"model.checkpoint={FIXTURE}")  # model=tiny's own numbers
    text = str(err.value)
    assert "\n" not in text
    for field, ours, theirs in (("hidden", 256, 64), ("vocab", 151936, 512),
                                ("tie_embeddings", True, False), ("num_layers", 4, 2)):
        assert f"{field} {theirs} (checkpoint) vs {ours} (model=tiny)" in text


def test_a_directory_without_config_json_is_rejected(tmp_path):
    with pytest.raises(PlanError, match="no config.json in that directory"):
        _compile("model=hf", f"model.checkpoint={tmp_path}")

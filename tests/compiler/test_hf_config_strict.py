"""A Hugging Face `config.json` is read strictly: every field that changes what the model
computes is refused with its name (never run as a different model), numeric fields of the
wrong type are one line, and an unreadable `tokenizer.json` names the file (issue 28 item 5).
The fixture is tests/fixtures/tiny_qwen3, copied and edited."""

import json
import shutil
import subprocess
import sys

import pytest
from paths import FIXTURES, ROOT

from compiler import PlanError, compile_plan
from compiler.model_entry import model_numbers, read_config
from locojax.config.compose import compose_config

FIXTURE = FIXTURES / "tiny_qwen3"

REFUSED = [  # (fields set in config.json, the name the line must hold)
    ({"rope_scaling": {"type": "longrope", "factor": 4.0}}, "rope_type='longrope'"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}}, "rope_type='dynamic'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "mscale": 0.7,
                       "original_max_position_embeddings": 64}}, "rope_scaling.mscale=0.7"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": False,
                       "original_max_position_embeddings": 64}}, "rope_scaling.truncate=False"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, "rope_scaling.factor='2'"),
    ({"rope_scaling": "yarn"}, "rope_scaling='yarn'"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 0},
     "use_sliding_window=true"),
    ({"attention_bias": True}, "attention_bias=true"),
    ({"mlp_bias": True}, "mlp_bias=true"),
    ({"no_rope_layers": [1, 1, 1, 0]}, "no_rope_layers"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ({"num_experts": 8}, "num_experts=8"),
    ({"attention_dropout": 0.1}, "attention_dropout=0.1"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"vocab_size": "32"}, "vocab_size='32'"),
    ({"num_hidden_layers": 2.0}, "num_hidden_layers=2.0"),
    ({"num_attention_heads": True}, "num_attention_heads=True"),
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps='1e-6'"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings='no'"),
    ({"model_type": "mixtral"}, "model_type='mixtral' is not supported (supported: "
                                "gemma3_text, llama, qwen2, qwen3, smollm3)"),
    ({"model_type": "gemma3"}, "model_type='gemma3' is not supported (supported: gemma3_text, "
                               "llama, qwen2, qwen3, smollm3): a Gemma 3 vision-language checkpoint"),
    ({"query_pre_attn_scalar": 256}, "query_pre_attn_scalar=256"),  # Gemma's, not Qwen3's
    ({"rope_local_base_freq": 10_000.0}, "rope_local_base_freq=10000.0"),
    ({"sliding_window_pattern": 6}, "sliding_window_pattern=6"),
    ({"model_type": "smollm3", "use_sliding_window": True, "sliding_window": 64,
      "max_window_layers": 99}, "use_sliding_window=true"),  # SmolLM3 ignores max_window_layers
    ({"model_type": "smollm3", "no_rope_layers": [1, 0, 1]}, "no_rope_layers=[1, 0, 1]"),
    ({"model_type": "smollm3", "no_rope_layers": [0, 1]}, "no_rope_layers=[0, 1]"),
    ({"model_type": "smollm3", "no_rope_layer_interval": 0}, "no_rope_layer_interval=0"),
]
ACCEPTED = [  # fields that do not change the function (or name the default)
    {"rope_scaling": None},
    {"rope_scaling": {"type": "default"}},
    {"use_sliding_window": False, "sliding_window": 64},
    {"use_sliding_window": True, "sliding_window": 4096},  # >= max_position_embeddings
    {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 28},  # no layer
    {"hidden_act": "silu", "attention_dropout": 0.0, "num_experts": 0},
    {"mlp_bias": False, "pretraining_tp": 1},
]


def _config(**fields):
    return {**read_config(FIXTURE), **fields}


GEMMA = FIXTURES / "tiny_gemma3"
GEMMA_REFUSED = [  # (fields set in tiny_gemma3's config.json, the name the line must hold)
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
    ({"hidden_activation": "gelu"}, "hidden_activation='gelu'"),
    ({"layer_types": ["full_attention", "sliding_attention", "sliding_attention"]},
     "layer_types"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ({"layer_types": ["sliding_attention", "full_attention", "chunked_attention"]},
     "layer_types"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
     "rope_parameters.sliding_attention.rope_type='linear'"),
    ({"rope_parameters": {"full_attention": {"rope_type": "dynamic", "factor": 2.0},
                          "sliding_attention": {"rope_type": "default"}}}, "rope_type='dynamic'"),
    ({"sliding_window": None}, "sliding_window=None"),
    ({"query_pre_attn_scalar": "24"}, "query_pre_attn_scalar='24'"),
    ({"query_pre_attn_scalar": None}, "query_pre_attn_scalar=None"),
]


@pytest.mark.parametrize(("fields", "name"), GEMMA_REFUSED, ids=[n for _, n in GEMMA_REFUSED])
def test_gemma3_refuses_what_its_decoder_does_not_compute(fields, name):
    with pytest.raises(ValueError) as err:
        model_numbers({**read_config(GEMMA), **fields})
    assert name in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_gemma3_reads_transformers_4_and_5_layouts_alike():
    """transformers 5.x (the fixture: `layer_types`, `rope_parameters` per layer kind) and
    4.5x (`sliding_window_pattern`, `rope_local_base_freq`, top-level `rope_theta` and
    `rope_scaling`) describe one model."""
    new = read_config(GEMMA)
    old = {k: v for k, v in new.items() if k not in ("layer_types", "rope_parameters")}
    old |= {"sliding_window_pattern": 2, "rope_local_base_freq": 1000.0, "rope_theta": 1e4,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    numbers = model_numbers(new)
    assert model_numbers(old) == numbers
    assert (numbers["family"], numbers["sliding_window"], numbers["sliding_pattern"],
            numbers["rope_local_theta"], numbers["query_pre_attn_scalar"]) == (
        "gemma3", 6, 2, 1000.0, 24.0)
    every_sliding = model_numbers({**new, "layer_types": ["sliding_attention"] * 3})
    every_full = model_numbers({**new, "layer_types": ["full_attention"] * 3})
    assert (every_sliding["sliding_pattern"], every_full["sliding_pattern"]) == (4, 0)
    assert (every_full["sliding_window"], every_full["rope_local_theta"]) == (0, 0.0)
    unset = {k: v for k, v in new.items() if k != "query_pre_attn_scalar"}
    assert model_numbers(unset)["query_pre_attn_scalar"] == 256.0  # transformers' default


def test_smollm3_reads_its_nope_layers_from_the_list_or_the_interval():
    """`no_rope_layers` (1: RoPE) and, without it, `no_rope_layer_interval` give one number:
    layers p-1, 2p-1, ... apply no RoPE."""
    smol = {**read_config(FIXTURE), "model_type": "smollm3", "num_hidden_layers": 8}
    listed = model_numbers({**smol, "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0]})
    assert (listed["family"], listed["nope_interval"]) == ("smollm3", 4)
    assert model_numbers(smol)["nope_interval"] == 4  # transformers' default interval
    assert model_numbers({**smol, "no_rope_layer_interval": 2})["nope_interval"] == 2
    assert model_numbers({**smol, "no_rope_layers": [1] * 8})["nope_interval"] == 0
    assert "nope_interval" not in model_numbers(read_config(FIXTURE))


@pytest.mark.parametrize(("fields", "name"), REFUSED, ids=[n for _, n in REFUSED])
def test_a_field_that_changes_the_model_is_refused_by_name(fields, name):
    with pytest.raises(ValueError) as err:
        model_numbers(_config(**fields))
    assert name in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("fields", ACCEPTED, ids=[str(f) for f in ACCEPTED])
def test_a_field_equal_to_what_the_runtime_computes_is_accepted(fields):
    assert model_numbers(_config(**fields)) == model_numbers(read_config(FIXTURE))


SCALED = [  # config.json's rope_scaling -> the RopeScaling read
    ({"rope_type": "linear", "factor": 2.0}, dict(kind="linear", factor=2.0)),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
     dict(kind="yarn", factor=4.0, original_max_position=64)),
    # without the original context, transformers' yarn reads max_position_embeddings (the
    # fixture's 512; 5.25's AutoConfig fills original_max_position_embeddings so)
    ({"type": "yarn", "factor": 4.0}, dict(kind="yarn", factor=4.0, original_max_position=512)),
    ({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192},
     dict(kind="llama3", factor=32.0, original_max_position=8192)),
]


@pytest.mark.parametrize(("rope", "want"), SCALED,
                         ids=["linear", "yarn", "yarn_without_original", "llama3"])
def test_a_rope_scaling_is_read_into_the_models_rope_scaling(rope, want):
    scaling = model_numbers(_config(rope_scaling=rope))["rope_scaling"]
    assert {k: getattr(scaling, k) for k in want} == want


def test_each_family_reads_its_own_options():
    qwen2 = model_numbers(_config(model_type="qwen2", attention_bias=True))
    llama = model_numbers(_config(model_type="llama"))
    assert (qwen2["family"], qwen2["qkv_bias"], qwen2["qk_norm"]) == ("qwen2", True, False)
    assert (llama["family"], llama["qkv_bias"], llama["qk_norm"]) == ("llama", False, False)
    with pytest.raises(ValueError, match="attention_bias=true"):
        model_numbers(_config(model_type="llama", attention_bias=True))


def _checkpoint(tmp_path, **fields):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, ckpt)
    (ckpt / "config.json").write_text(json.dumps(_config(**fields)))
    return ckpt


def test_the_compiler_names_the_key_the_file_and_the_field(tmp_path):
    ckpt = _checkpoint(tmp_path, rope_scaling={"type": "dynamic", "factor": 4.0})
    with pytest.raises(PlanError) as err:
        compile_plan(compose_config(["model=hf", f"model.checkpoint={ckpt}", "mesh=cpu",
                                     "model.tokenizer=char"]))
    assert str(err.value).startswith(f"model.checkpoint={ckpt}: config.json: "
                                     "rope_type='dynamic'")


def test_the_runtime_reader_names_the_file(tmp_path):
    from locojax.model import CheckpointError
    from locojax.model.hf_io import _config as runtime_config

    ckpt = _checkpoint(tmp_path, vocab_size="32")
    with pytest.raises(CheckpointError, match=rf"^{ckpt / 'config.json'}: vocab_size='32': "
                                              "must be an integer$"):
        runtime_config(ckpt)


def test_a_tokenizer_json_that_is_not_json_names_the_file(tmp_path):
    from locojax.tokenizers import load_tokenizer

    ckpt = _checkpoint(tmp_path)
    (ckpt / "tokenizer.json").write_text("{oops")
    with pytest.raises(ValueError, match=rf"^{ckpt / 'tokenizer.json'}: not a tokenizer file"):
        load_tokenizer("checkpoint", checkpoint_dir=ckpt)
    (ckpt / "tokenizer.json").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match=rf"^{ckpt / 'tokenizer.json'}: cannot read it"):
        load_tokenizer("checkpoint", checkpoint_dir=ckpt)


def test_sample_with_gelu_is_one_line_naming_the_field_and_the_file(tmp_path):
    ckpt = _checkpoint(tmp_path, hidden_act="gelu")
    out = subprocess.run([sys.executable, "-m", "locojax.sample", f"model.checkpoint={ckpt}",
                          "model.tokenizer=char", "prompt='3+5='"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert "hidden_act='gelu'" in lines[0] and str(ckpt) in lines[0], lines


def test_a_config_without_rope_theta_takes_its_familys_default():
    """transformers' default RoPE base when config.json gives none: 10,000 (Qwen3, Qwen2,
    Llama), Gemma 3's full layers 1e6, SmolLM3 2e6 (its config classes' `default_theta`)."""
    def unset(config):
        config = {k: v for k, v in config.items() if k != "rope_theta"}
        rope = config.get("rope_parameters")
        if isinstance(rope, dict):  # transformers 5.x: the base per layer kind
            config["rope_parameters"] = {
                k: ({kk: vv for kk, vv in v.items() if kk != "rope_theta"}
                    if isinstance(v, dict) and k != "sliding_attention" else v)
                for k, v in rope.items() if k != "rope_theta"}
        return config

    def theta(config):
        return model_numbers(unset(config))["rope_theta"]

    qwen = read_config(FIXTURE)
    assert theta(qwen) == 10_000.0
    assert theta({**qwen, "model_type": "smollm3"}) == 2_000_000.0
    assert theta(read_config(GEMMA)) == 1_000_000.0
    assert model_numbers({**unset(qwen), "rope_theta": 5e5})["rope_theta"] == 5e5  # 4.x form

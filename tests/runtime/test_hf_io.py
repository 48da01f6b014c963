"""Golden tests against transformers (fixtures from tests/fixtures/make_hf_fixture.py) and
Hugging Face checkpoint round trips. No torch needed."""

import dataclasses
import json
import shutil
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from paths import FIXTURES

from locojax.model import (
    KVCache,
    abstract_model,
    arch_from_hf_config,
    export_hf_checkpoint,
    flat_params,
    init_cache,
    load_hf_checkpoint,
)

NAMES = ["tiny_qwen3", "tiny_qwen3_tied_sharded", "tiny_qwen2", "tiny_llama", "tiny_gemma3",
         "tiny_smollm3"]
ATOL = 1e-4
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "llama": "LlamaForCausalLM", "gemma3": "Gemma3ForCausalLM",
                 "smollm3": "SmolLM3ForCausalLM"}


@pytest.fixture(scope="module", params=NAMES)
def fixture(request):
    arch, params = load_hf_checkpoint(FIXTURES / request.param)
    expected = dict(np.load(FIXTURES / request.param / "expected.npz"))
    return request.param, arch, params, expected


def positions(b, length):
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))


def test_fixture_archs():
    untied, _ = load_hf_checkpoint(FIXTURES / "tiny_qwen3")
    tied, _ = load_hf_checkpoint(FIXTURES / "tiny_qwen3_tied_sharded")
    index = json.loads((FIXTURES / NAMES[1] / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2, "the tied fixture must be sharded"
    assert (untied.tie_embeddings, tied.tie_embeddings) == (False, True)
    assert untied == dataclasses.replace(tied, tie_embeddings=False)
    assert (untied.num_layers, untied.hidden, untied.num_heads, untied.num_kv_heads) == (
        2,
        64,
        4,
        2,
    )
    assert (untied.head_dim, untied.ffn, untied.vocab, untied.rope_theta) == (16, 128, 512, 1e4)


def test_an_index_naming_shards_outside_the_checkpoint_is_refused(tmp_path):
    """Issue 41: a shard path that leaves the checkpoint directory (absolute, or through ..)
    is one line, never read; a shard that is a symlink (the Hub cache's blobs) still loads."""
    from locojax.model import CheckpointError

    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / NAMES[1], ckpt)
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first = next(iter(index["weight_map"]))
    blob = tmp_path / "blobs" / index["weight_map"][first]
    blob.parent.mkdir()
    shutil.move(ckpt / index["weight_map"][first], blob)
    (ckpt / index["weight_map"][first]).symlink_to(blob)
    load_hf_checkpoint(ckpt)
    for outside in (f"../blobs/{blob.name}", str(blob)):
        bad = index | {"weight_map": index["weight_map"] | {first: outside}}
        index_path.write_text(json.dumps(bad))
        with pytest.raises(CheckpointError, match="which is not a file of"):
            load_hf_checkpoint(ckpt)


def test_family_fixtures_read_as_their_options():
    qwen2, _ = load_hf_checkpoint(FIXTURES / "tiny_qwen2")
    llama, _ = load_hf_checkpoint(FIXTURES / "tiny_llama")
    assert (qwen2.family, qwen2.qkv_bias, qwen2.qk_norm, qwen2.tie_embeddings) == (
        "qwen2", True, False, False)
    assert (qwen2.num_heads, qwen2.num_kv_heads, qwen2.head_dim) == (3, 1, 16)
    assert (llama.family, llama.qkv_bias, llama.qk_norm, llama.tie_embeddings) == (
        "llama", False, False, True)
    r = llama.rope_scaling
    assert (r.kind, r.factor, r.original_max_position, r.low_freq_factor,
            r.high_freq_factor) == ("llama3", 8.0, 16, 1.0, 4.0)


def test_gemma3_fixture_reads_as_its_options():
    gemma, _ = load_hf_checkpoint(FIXTURES / "tiny_gemma3")
    assert (gemma.family, gemma.qkv_bias, gemma.qk_norm, gemma.tie_embeddings) == (
        "gemma3", False, True, True)
    assert gemma.sliding_layers == (True, False, True)
    assert (gemma.sliding_window, gemma.sliding_pattern, gemma.rope_local_theta,
            gemma.query_pre_attn_scalar, gemma.rope_theta) == (6, 2, 1000.0, 24.0, 1e4)
    assert (gemma.rope_scaling.kind, gemma.rope_scaling.factor) == ("linear", 2.0)
    options = gemma.options
    assert (options.norm_offset, options.sandwich_norms, options.activation,
            options.embed_scale) == (1.0, True, "gelu_pytorch_tanh", True)


def test_smollm3_fixture_reads_as_its_options_and_exports_its_nope_layers(tmp_path):
    smol, params = load_hf_checkpoint(FIXTURES / "tiny_smollm3")
    assert (smol.family, smol.qkv_bias, smol.qk_norm, smol.tie_embeddings) == (
        "smollm3", False, False, True)
    assert (smol.nope_interval, smol.rope_layers) == (2, (True, False, True, False))
    assert (smol.rope_scaling.kind, smol.rope_scaling.factor) == ("linear", 2.0)
    export_hf_checkpoint(smol, params, tmp_path)
    ours, theirs = (json.loads((d / "config.json").read_text())
                    for d in (tmp_path, FIXTURES / "tiny_smollm3"))
    for key in ("no_rope_layers", "layer_types", "use_sliding_window"):
        assert ours[key] == theirs[key], key
    assert ours["pad_token_id"] is None  # SmolLM3's default 128004 lies past a vocab of 512


def test_export_refuses_nope_layers_on_a_family_without_them(tmp_path):
    llama, params = load_hf_checkpoint(FIXTURES / "tiny_llama")
    with pytest.raises(ValueError, match="nope_interval=2"):
        export_hf_checkpoint(dataclasses.replace(llama, nope_interval=2), params, tmp_path)


def test_full_forward_matches_transformers(fixture):
    _, arch, params, expected = fixture
    model = nnx.merge(abstract_model(arch)[0], params)
    tokens_BxL = jnp.asarray(expected["tokens_BxL"])
    hidden, _ = model(tokens_BxL, positions(*tokens_BxL.shape))
    np.testing.assert_allclose(model.logits(hidden), expected["logits_BxLxV"], atol=ATOL, rtol=0)


def test_cached_decode_matches_transformers(fixture):
    _, arch, params, expected = fixture
    model = nnx.merge(abstract_model(arch)[0], params)
    tokens_BxL = jnp.asarray(expected["tokens_BxL"])
    b, length = tokens_BxL.shape
    hidden, cache = model(tokens_BxL[:, :5], positions(b, 5),
                          cache=init_cache(arch, b, length + 4))
    logits = [model.logits(hidden)]
    for i in range(5, length):
        pos = jnp.full((b, 1), i, jnp.int32)
        hidden, cache = model(tokens_BxL[:, i : i + 1], pos, cache=cache)
        logits.append(model.logits(hidden))
    assert int(cache.end) == length
    np.testing.assert_allclose(
        jnp.concatenate(logits, 1), expected["logits_BxLxV"], atol=ATOL, rtol=0
    )


@partial(jax.jit, static_argnums=(0, 4, 5))
def greedy(graphdef, params, prompts_BxP, pad_B, new: int, max_len: int):
    """Greedy continuation of LEFT-padded prompts: one prefill, then L=1 steps in a while_loop."""
    model = nnx.merge(graphdef, params)
    b, width = prompts_BxP.shape
    positions_BxP = jnp.maximum(jnp.arange(width)[None] - pad_B[:, None], 0)
    kv_valid_BxS = jnp.arange(max_len)[None] >= pad_B[:, None]
    cache = init_cache(model.arch, b, max_len)
    hidden, cache = model(prompts_BxP, positions_BxP, cache=cache, kv_valid_BxS=kv_valid_BxS)
    tok_B = jnp.argmax(model.logits(hidden[:, -1:])[:, 0], -1).astype(jnp.int32)
    out_BxT = jnp.zeros((b, new), jnp.int32).at[:, 0].set(tok_B)

    def step(state):
        i, tok_B, cache, out_BxT = state
        pos_Bx1 = (cache.end - pad_B)[:, None]
        hidden, cache = model(tok_B[:, None], pos_Bx1, cache=cache, kv_valid_BxS=kv_valid_BxS)
        tok_B = jnp.argmax(model.logits(hidden)[:, 0], -1).astype(jnp.int32)
        return i + 1, tok_B, cache, out_BxT.at[:, i].set(tok_B)

    state = jax.lax.while_loop(lambda s: s[0] < new, step, (1, tok_B, cache, out_BxT))
    return state[3]


def test_greedy_batch_is_token_for_token_transformers_greedy(fixture):
    _, arch, params, expected = fixture
    prompts_BxP = jnp.asarray(expected["greedy_prompts_BxP"])
    pad_B = prompts_BxP.shape[1] - jnp.asarray(expected["greedy_prompt_lens_B"])
    want_BxT = expected["greedy_new_BxT"]
    graphdef = abstract_model(arch)[0]
    got = greedy(graphdef, params, prompts_BxP, pad_B, want_BxT.shape[1],
                 prompts_BxP.shape[1] + want_BxT.shape[1])
    np.testing.assert_array_equal(got, want_BxT)


def assert_params_bitwise_equal(a, b):
    fa, fb = flat_params(a), flat_params(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        x, y = np.asarray(fa[name][...]), np.asarray(fb[name][...])
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert x.tobytes() == y.tobytes(), name
        assert fa[name].get_metadata()["out_sharding"] == fb[name].get_metadata()["out_sharding"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_then_import_is_bitwise_exact(fixture, dtype, tmp_path):
    _, arch, params, _ = fixture
    arch = dataclasses.replace(arch, dtype=dtype)
    params = jax.tree.map(lambda x: x.astype(arch.jnp_dtype), params)
    export_hf_checkpoint(arch, params, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURES[arch.family]]
    assert config["torch_dtype"] == dtype
    arch2, params2 = load_hf_checkpoint(tmp_path)
    assert arch2 == arch
    assert_params_bitwise_equal(params, params2)


@pytest.mark.parametrize("name", ["tiny_qwen3", "tiny_qwen2", "tiny_llama", "tiny_gemma3",
                                  "tiny_smollm3"])
def test_export_matches_original_checkpoint_tensors(name, tmp_path):
    """Our export of a loaded HF checkpoint holds exactly the tensors transformers wrote,
    and a config.json of the same model type and RoPE scaling."""
    from safetensors.numpy import load_file

    arch, params = load_hf_checkpoint(FIXTURES / name)
    export_hf_checkpoint(arch, params, tmp_path)
    theirs_config = json.loads((FIXTURES / name / "config.json").read_text())
    ours_config = json.loads((tmp_path / "config.json").read_text())
    assert ours_config["model_type"] == theirs_config["model_type"]
    rope = {k: v for k, v in theirs_config["rope_parameters"].items() if k != "rope_theta"}
    assert {k: ours_config["rope_parameters"][k] for k in rope} == rope
    ours, theirs = (
        load_file(tmp_path / "model.safetensors"),
        load_file(FIXTURES / name / "model.safetensors"),
    )
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


def test_load_casts_dtype_and_rejects_unknown_tensors(tmp_path):
    arch, params = load_hf_checkpoint(FIXTURES / "tiny_qwen3", dtype="bfloat16")
    assert arch.dtype == "bfloat16"
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    shutil.copytree(FIXTURES / "tiny_qwen3", tmp_path, dirs_exist_ok=True)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="q_proj.bias"):
        load_hf_checkpoint(tmp_path)
    del tensors["model.layers.0.self_attn.q_proj.bias"], tensors["model.norm.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="model.norm.weight is missing"):
        load_hf_checkpoint(tmp_path)


def test_transformers_4_config_of_qwen3_0_6b():
    """The published Qwen3-0.6B config.json (transformers 4.51 layout)."""
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "max_position_embeddings": 40960,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }
    arch = arch_from_hf_config(config)
    assert (arch.num_layers, arch.hidden, arch.num_heads, arch.num_kv_heads) == (28, 1024, 16, 8)
    assert (arch.head_dim, arch.ffn, arch.vocab, arch.tie_embeddings) == (128, 3072, 151936, True)
    assert (arch.rope_theta, arch.norm_eps, arch.dtype) == (1e6, 1e-6, "bfloat16")
    with pytest.raises(ValueError, match="model_type"):
        arch_from_hf_config({**config, "model_type": "mixtral"})


def test_kv_cache_is_a_pytree():
    arch, _ = load_hf_checkpoint(FIXTURES / "tiny_qwen3")
    cache = init_cache(arch, batch=3, max_len=7)
    leaves, treedef = jax.tree.flatten(cache)
    assert [x.shape for x in leaves] == [(2, 3, 2, 7, 16), (2, 3, 2, 7, 16), ()]
    assert isinstance(jax.tree.unflatten(treedef, leaves), KVCache) and cache.max_len == 7

"""The family presets (conf/model) have the published models' shapes: the compiler's parameter
count of each equals the count its model card states, recomputed from its config.json."""

import pytest

from compiler.params import param_count
from locojax.config.compose import compose_config


def compose_model(name: str):
    """The model entry as Hydra composes it (`model=<name>`)."""
    return compose_config([f"model={name}"]).model

PUBLISHED = {  # preset: (parameters, where the count is stated)
    "qwen2_5_0_5b": (494_032_768, "Qwen2.5-0.5B model card: 0.49B; safetensors index"),
    "qwen2_5_1_5b": (1_543_714_304, "Qwen2.5-1.5B model card: 1.54B; safetensors index"),
    "qwen2_5_math_1_5b": (1_543_714_304, "Qwen2.5-Math-1.5B: Qwen2.5-1.5B's shapes"),
    "llama3_2_1b": (1_235_814_400, "Llama-3.2-1B model card: 1.23B; safetensors index"),
    "llama3_2_3b": (3_212_749_824, "Llama-3.2-3B model card: 3.21B; safetensors index"),
    "smollm2_360m": (361_821_120, "SmolLM2-360M model card: 362M; safetensors index"),
    "gemma3_1b": (999_885_952, "gemma-3-1b-pt: 1B; safetensors index, four norms per layer"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_equals_the_published_one(name):
    assert param_count(compose_model(name)) == PUBLISHED[name][0], PUBLISHED[name][1]


def test_the_family_options_are_the_published_ones():
    qwen, llama = compose_model("qwen2_5_1_5b"), compose_model("llama3_2_1b")
    assert (qwen.family, qwen.qkv_bias, qwen.qk_norm, qwen.rope_scaling.kind) == (
        "qwen2", True, False, "default")
    assert (llama.family, llama.qkv_bias, llama.tie_embeddings) == ("llama", False, True)
    r = llama.rope_scaling
    assert (r.kind, r.factor, r.original_max_position, r.low_freq_factor,
            r.high_freq_factor) == ("llama3", 32.0, 8192, 1.0, 4.0)


def test_gemma3_1b_has_the_published_layer_kinds():
    """gemma-3-1b-pt: 26 layers, every 6th full (layers 5, 11, 17, 23), window 512, RoPE
    bases 1e6 (full) and 1e4 (sliding), scores by 256^-0.5, the Gemma family's options."""
    from compiler.families import FAMILIES
    from locojax.runtime.assemble import model_arch

    gemma = compose_model("gemma3_1b")
    arch = model_arch(gemma)
    assert [i for i, s in enumerate(arch.sliding_layers) if not s] == [5, 11, 17, 23]
    assert (arch.sliding_window, arch.rope_theta, arch.rope_local_theta,
            arch.query_scale) == (512, 1e6, 1e4, 1.0)
    family = FAMILIES[gemma.family]
    assert (family.model_type, family.norm_offset, family.sandwich_norms, family.activation,
            family.embed_scale) == ("gemma3_text", 1.0, True, "gelu_pytorch_tanh", True)


def test_smollm3_3b_has_its_nope_layers_and_the_computed_count():
    """SmolLM3-3B: 36 layers, every 4th without RoPE (3, 7, ..., 35), RoPE base 5e6, tied.
    Its count is computed from the shapes (128,256 x 2,048 embedding + 36 layers of
    78,123,008 + the final norm), not read from the hub."""
    from compiler.families import FAMILIES
    from locojax.runtime.assemble import model_arch

    smol = compose_model("smollm3_3b")
    arch = model_arch(smol)
    assert [i for i, r in enumerate(arch.rope_layers) if not r] == list(range(3, 36, 4))
    assert (arch.rope_theta, arch.tie_embeddings, arch.max_position) == (5e6, True, 65536)
    assert param_count(smol) == 128_256 * 2048 + 36 * 78_123_008 + 2048 == 3_075_098_624
    family = FAMILIES[smol.family]
    assert (family.model_type, family.architecture, family.qk_norm, family.nope_layers) == (
        "smollm3", "SmolLM3ForCausalLM", False, True)


def test_every_family_record_has_every_field():
    """One record per family (compiler.families.Family): every `model.family` has one, each
    field set (a callable export hook, known layer names), and every family's model_type is
    its own."""
    from dataclasses import fields

    from compiler.families import FAMILIES
    from compiler.vocab import ModelFamily
    from locojax.model.hf_io import _LAYER_NAMES

    assert set(ModelFamily) - set(FAMILIES) == {ModelFamily.llama3}  # plan-only (70B, 405B)
    assert len({f.model_type for f in FAMILIES.values()}) == len(FAMILIES)
    for name, family in FAMILIES.items():
        assert family.name is name
        for field in fields(family):
            assert getattr(family, field.name) is not None, (name, field.name)
        assert callable(family.config_keys) and family.architecture.endswith("ForCausalLM")
        ours = {k for k, _ in family.layer_names}
        assert ours <= set(_LAYER_NAMES) | {"layers/attn_post_norm/scale",
                                            "layers/mlp_post_norm/scale"}, name

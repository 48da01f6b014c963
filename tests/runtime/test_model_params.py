"""The model's parameter tree equals the compiler's parameter table, for every entry of a
family the runtime builds (Qwen3, Qwen2, Llama, Gemma 3)."""

import dataclasses

import jax
import pytest
import yaml
from flax import nnx
from paths import CONF

from compiler.axes import LogicalAxis
from compiler.config import ModelConfig, RopeScaling
from compiler.model_entry import RUNTIME_FAMILIES, with_compute_dtype
from compiler.params import param_count, param_table
from locojax.model import ModelArch, Qwen3, abstract_model, flat_params, split_params
from locojax.runtime.assemble import model_arch

CONF_MODEL = CONF / "model"


def arch_of(model: ModelConfig) -> ModelArch:
    """The runtime arch of a config entry, built by the coordination glue itself."""
    return model_arch(model)


def tiny_config(tied: bool, qk_norm: bool = True) -> ModelConfig:
    return ModelConfig(
        num_layers=3,
        hidden=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        ffn=48,
        vocab=97,
        tie_embeddings=tied,
        qk_norm=qk_norm,
        dtype="float32",
    )


def runtime_entries() -> list[ModelConfig]:
    out = []
    for path in sorted(CONF_MODEL.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if data["family"] in RUNTIME_FAMILIES and not data["from_checkpoint"]:  # hf: later
            if "rope_scaling" in data:
                data["rope_scaling"] = RopeScaling(**data["rope_scaling"])
            out.append(with_compute_dtype(ModelConfig(**data), "cpu"))  # as composition does
    return out


def assert_matches_table(params, model: ModelConfig):
    flat = flat_params(params)
    table = {p.name: p for p in param_table(model)}
    assert sorted(flat) == sorted(table)
    for name, var in flat.items():
        assert var.shape == table[name].shape, name
        assert var.get_metadata()["out_sharding"] == table[name].axes, name
        assert var.dtype == arch_of(model).jnp_param_dtype, name  # the master copy


@pytest.mark.parametrize(
    "tied,qk_norm,bias", [(True, True, False), (False, True, False), (True, False, False),
                          (False, False, True)], ids=["tied", "untied", "no_qk", "qwen2"]
)
def test_concrete_tiny_model_matches_param_table(tied, qk_norm, bias):
    model = dataclasses.replace(tiny_config(tied, qk_norm), qkv_bias=bias)
    _, params = split_params(Qwen3(arch_of(model), rngs=nnx.Rngs(0)))
    assert_matches_table(params, model)
    assert sum(v.size for v in jax.tree.leaves(params)) == param_count(model)


def test_gemma3_model_matches_param_table_with_four_norms_built_at_zero():
    """Gemma 3's sandwich norms are in the table and the tree; its (1 + w) norms start at
    w = 0 (the identity), as transformers builds them."""
    model = dataclasses.replace(tiny_config(True), family="gemma3", sliding_window=4,
                                sliding_pattern=3, rope_local_theta=1e4)
    _, params = split_params(Qwen3(arch_of(model), rngs=nnx.Rngs(0)))
    assert_matches_table(params, model)
    norms = {n: v for n, v in flat_params(params).items() if n.endswith("norm/scale")}
    assert sorted(norms) == sorted(
        ["final_norm/scale", "layers/attn/k_norm/scale", "layers/attn/q_norm/scale",
         "layers/attn_norm/scale", "layers/attn_post_norm/scale", "layers/mlp_norm/scale",
         "layers/mlp_post_norm/scale"])
    assert all(not jax.numpy.any(v[...]) for v in norms.values())


@pytest.mark.parametrize("model", runtime_entries(), ids=lambda m: m.name)
def test_every_runtime_entry_builds_abstractly(model):
    _, params = abstract_model(arch_of(model))
    assert_matches_table(params, model)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params))


def test_qwen3_0_6b_param_count():
    model = next(m for m in runtime_entries() if m.name == "qwen3_0_6b")
    _, params = abstract_model(arch_of(model))
    assert sum(v.size for v in flat_params(params).values()) == 596_049_920


def test_layer_slices_are_independently_initialised():
    _, params = split_params(Qwen3(arch_of(tiny_config(True)), rngs=nnx.Rngs(0)))
    q_NxDxHxhd = flat_params(params)["layers/attn/q_proj"][...]
    assert not (q_NxDxHxhd[0] == q_NxDxHxhd[1]).all()


def test_logical_axes_resolve_to_mesh_specs_under_rules():
    """The metadata is usable as is: flax logical-axis rules turn it into PartitionSpecs."""
    from jax.sharding import PartitionSpec as P

    _, params = abstract_model(arch_of(tiny_config(tied=False)))
    mesh_axis = {"embed": "fsdp", "heads": "tensor", "kv_heads": "tensor", "mlp": "tensor"}
    rules = [(a.value, mesh_axis.get(a.value)) for a in LogicalAxis]  # every axis needs a rule
    with nnx.logical_axis_rules(rules):
        specs = flat_params(nnx.get_partition_spec(params))
    assert specs["layers/attn/q_proj"].get_value() == P(None, "fsdp", "tensor", None)
    assert specs["layers/mlp/down_proj"].get_value() == P(None, "tensor", "fsdp")
    assert specs["lm_head/kernel"].get_value() == P("fsdp", None)

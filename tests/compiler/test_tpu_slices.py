"""TPU slices as JAX's compile-only topology API names them (`compiler.hardware.tpu_slice`),
the v4, v5e and v6e entries, and the slice JAX cannot describe as one keyed line."""

import pytest
from compiler_cases import make_config

from compiler import PlanError, compile_plan
from compiler.generations import TPU_GENERATIONS
from compiler.hardware import slice_shape, tpu_slice
from compiler.passes.topology import resolve_topology
from locojax.config.compose import compose_config

GIB = 1024**3


def _topology(hardware: str, chips: int):
    cfg = make_config(hardware=hardware, mesh={"kind": "tpu", "chips": chips})
    return resolve_topology(cfg.mesh, cfg.hardware, None)


def _slice(hardware: str, chips: int):
    topo = _topology(hardware, chips)
    return topo, tpu_slice(topo.hardware, topo.chips, topo.hosts)


# (hardware, chips) -> (topology name, accelerator type, hosts, devices); names as MaxText's
# accelerator_to_spec_map.py and libtpu 0.0.42.1 take them (checked with get_topology_desc).
SLICES = {
    ("v5e", 1): ("v5e:1x1", "v5litepod-1", 1, 1),
    ("v6e", 1): ("v6e:1x1", "v6e-1", 1, 1),
    ("v5e", 4): ("v5e:2x2", "v5litepod-4", 1, 4),
    ("v5e", 8): ("v5e:2x4", "v5litepod-8", 1, 8),
    ("v5e", 16): ("v5e:4x4", "v5litepod-16", 2, 16),
    ("v5e", 64): ("v5e:8x8", "v5litepod-64", 8, 64),
    ("v5e", 256): ("v5e:16x16", "v5litepod-256", 32, 256),
    ("v6e", 8): ("v6e:2x4", "v6e-8", 1, 8),
    ("v6e", 16): ("v6e:4x4", "v6e-16", 2, 16),
    ("v6e", 64): ("v6e:8x8", "v6e-64", 8, 64),
    ("v6e", 256): ("v6e:16x16", "v6e-256", 32, 256),
    ("v4", 4): ("v4:2x2x1", "v4-8", 1, 4),
    ("v4", 8): ("v4:2x2x2", "v4-16", 2, 8),
    ("v4", 64): ("v4:4x4x4", "v4-128", 16, 64),
    ("v4", 256): ("v4:4x8x8", "v4-512", 64, 256),
    ("v5p", 4): ("v5:2x2x1", "v5p-8", 1, 4),
    ("v5p", 16): ("v5:2x2x4", "v5p-32", 4, 16),
    ("v5p", 64): ("v5:4x4x4", "v5p-128", 16, 64),
    ("v5p", 256): ("v5:4x8x8", "v5p-512", 64, 256),
    ("v7x", 4): ("tpu7x:2x2x1", "tpu7x-8", 1, 8),
    ("v7x", 8): ("tpu7x:2x2x2", "tpu7x-16", 2, 16),
    ("v7x", 16): ("tpu7x:2x2x4", "tpu7x-32", 4, 32),
    ("v7x", 64): ("tpu7x:4x4x4", "tpu7x-128", 16, 128),
    ("v7x", 256): ("tpu7x:4x8x8", "tpu7x-512", 64, 512),
}


@pytest.mark.parametrize("hardware,chips", sorted(SLICES))
def test_topology_names_hosts_and_devices(hardware, chips):
    topo, target = _slice(hardware, chips)
    name, accelerator, hosts, devices = SLICES[hardware, chips]
    assert (target.topology_name, target.accelerator_type) == (name, accelerator)
    assert (target.hosts, target.devices) == (hosts, devices) == (topo.hosts, topo.devices)
    assert target.chip_config == ("megacore" if hardware in ("v4", "v5p") else "default")


def test_host_bounds_and_wrap():
    _, v5e = _slice("v5e", 256)
    assert (v5e.host_bounds, v5e.wrap) == ((2, 4, 1), (True, True, False))
    _, small = _slice("v5e", 4)
    assert (small.host_bounds, small.wrap) == ((2, 2, 1), (False, False, False))
    _, v7x = _slice("v7x", 64)
    assert (v7x.host_bounds, v7x.wrap) == ((2, 2, 1), (True, True, True))
    _, v7x8 = _slice("v7x", 8)
    assert v7x8.wrap == (False, False, False)


def test_device_memory_as_the_tpu_compiler_reports_it():
    want = {"v5e": 15.75, "v6e": 31.25, "v5p": 95.74, "v7x": 94.75, "v4": 30.75}
    for hardware, gib in want.items():
        assert _slice(hardware, 8)[1].device_hbm_bytes == gib * GIB
    # the new entries' plans budget what the compiler has (one device per chip)
    for hardware in ("v4", "v5e", "v6e"):
        topo, target = _slice(hardware, 8)
        assert topo.device_memory_bytes == target.device_hbm_bytes


@pytest.mark.parametrize("hardware,chips,shape", [
    ("v5e", 4, (2, 2)), ("v5e", 8, (2, 4)), ("v5e", 32, (4, 8)), ("v5e", 128, (8, 16)),
    ("v6e", 16, (4, 4)), ("v7x", 128, (4, 4, 8))])
def test_slice_shapes(hardware, chips, shape):
    assert _topology(hardware, chips).slice_shape == shape


@pytest.mark.parametrize("hardware,chips,words", [
    ("v5e", 512, "at most 256"), ("v5e", 12, "powers of 2"), ("v6e", 2, "powers of 2"),
    ("v4", 12, "3D torus")])
def test_a_slice_that_does_not_exist_is_one_keyed_line(hardware, chips, words):
    with pytest.raises(PlanError) as err:
        compile_plan(make_config(hardware=hardware, mesh={"kind": "tpu", "chips": chips}))
    assert err.value.key == "mesh.chips" and err.value.rule_id == "tpu_slice"
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_slice_jax_cannot_describe_is_one_keyed_line():
    cfg = make_config(hardware="v5e", mesh={"kind": "tpu", "chips": 16})
    hw = cfg.hardware
    with pytest.raises(PlanError) as err:  # 16 chips on 8 hosts: hosts of 2 chips
        tpu_slice(hw, 16, 8)
    assert (err.value.key, err.value.rule_id) == ("mesh.chips", "tpu_target")
    assert "hosts of 1, 4, 8 chips" in str(err.value)
    with pytest.raises(PlanError) as err:
        tpu_slice(hw, 512, 64)
    assert (err.value.key, err.value.rule_id) == ("mesh.chips", "tpu_target")
    h100 = make_config(hardware="h100", mesh={"kind": "gpu", "chips": 8}).hardware
    with pytest.raises(PlanError) as err:
        tpu_slice(h100, 8, 1)
    assert (err.value.key, err.value.rule_id) == ("hardware", "tpu_target")
    assert "tpu7x" in str(err.value)


def test_every_generation_has_a_hardware_entry_and_a_mesh():
    kinds = {compose_config([f"mesh={name}"]).hardware.device_kind
             for name in ("v4", "v5e", "v5p", "v6e", "v7x")}
    assert kinds == set(TPU_GENERATIONS)
    for name in ("v4", "v5e", "v6e"):
        cfg = compose_config([f"mesh={name}"])
        assert cfg.hardware.name == name and cfg.mesh.kind == "tpu"
        assert cfg.hardware.source and cfg.hardware.peak_flops_bf16 > 0


def test_memory_fit_on_v5e_starts_at_two_whole_hosts():
    plan = compile_plan(compose_config(["+experiment=gsm8k_co", "mesh=v5e", "mesh.chips=0"]))
    assert plan.topology.hosts >= 2 and plan.topology.chips % 8 == 0
    assert slice_shape(plan.topology.hardware, plan.topology.chips) == plan.topology.slice_shape


def test_a_generations_compiler_facts_are_its_records_fields():
    """Issue 37: what one TPU generation's compiler does differently (TPU7x's kept head, its
    re-tiled embedding and prefill weights) is a field of its record, read by the cost model
    through the device kind; the other generations take the shared constants."""
    from dataclasses import replace

    from compiler.config import ModelConfig
    from compiler.cost.memory import (
        TPU_ACTIVATIONS,
        compiler_activations,
        embedding_relayout_bytes,
    )

    model = ModelConfig()
    for kind, gen in TPU_GENERATIONS.items():
        kept = compiler_activations("tpu", kind)
        assert kept == (TPU_ACTIVATIONS if gen.head_kept_copies is None else replace(
            TPU_ACTIVATIONS, head_kept_copies=gen.head_kept_copies)), kind
        assert (embedding_relayout_bytes(model, kind, 1) > 0) == gen.embedding_relayout, kind
    assert compiler_activations("tpu", "TPU7x").head_kept_copies == 1.8
    assert {k for k, g in TPU_GENERATIONS.items() if g.weight_retile} == {"TPU7x"}


def test_one_chip_is_a_plan_of_its_own():
    # A v5litepod-1 VM: one host of one chip, its own host bounds (libtpu 0.0.42.1 compiles
    # for v5e:1x1 with chips_per_host_bounds 1x1x1).
    _, target = _slice("v5e", 1)
    assert target.host_bounds == (1, 1, 1) and target.wrap == (False, False, False)
    plan = compile_plan(compose_config(["+experiment=gsm8k_co", "mesh=v5e", "mesh.chips=1"]))
    assert (plan.topology.hosts, plan.topology.chips) == (1, 1)
    assert plan.batch.slots >= 1 and plan.batch.fused_attention


@pytest.mark.parametrize(("chips", "fused"), [(1, True), (4, False), (8, False)])
def test_splash_attention_is_planned_on_one_device_only(chips, fused):
    """The plan counts splash attention's memory for a one-device train mesh, where the chip
    ran it; larger meshes keep XLA's attention (compiler.cost.memory.SPLASH_MAX_DEVICES)."""
    plan = compile_plan(compose_config(["+experiment=gsm8k_co", "mesh=v5e",
                                        f"mesh.chips={chips}"]))
    assert plan.batch.fused_attention is fused

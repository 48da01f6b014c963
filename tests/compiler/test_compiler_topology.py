"""Topology pass: hosts, devices and chips per mesh kind; every bad mesh names its key."""

import pytest
from compiler_cases import make_config

from compiler import DetectedTopology, PlanError, compile_plan
from compiler.hardware import torus_shape
from compiler.passes.topology import resolve_topology


def _topology(cfg, detected):
    return resolve_topology(cfg.mesh, cfg.hardware, detected)


def _tpu(chips, hardware="v7x", **mesh):
    return make_config(hardware=hardware, mesh={"kind": "tpu", "chips": chips, **mesh})


def test_chips_12_is_not_a_tpu_slice():
    with pytest.raises(PlanError) as err:
        compile_plan(_tpu(12))
    assert err.value.key == "mesh.chips" and err.value.value == 12
    assert err.value.rule_id == "tpu_slice"
    assert str(err.value) == (
        "mesh.chips=12: not a valid TPU slice size for v7x (3D torus slices have 4, 8, 16, "
        "32 chips, or multiples of 64 built from 4x4x4 cubes)")


@pytest.mark.parametrize("chips,shape", [
    (4, (2, 2, 1)), (8, (2, 2, 2)), (16, (2, 2, 4)), (32, (2, 4, 4)), (64, (4, 4, 4)),
    (128, (4, 4, 8)), (192, (4, 4, 12)), (256, (4, 8, 8)), (512, (8, 8, 8)),
    (4096, (16, 16, 16))])
def test_valid_torus_shapes(chips, shape):
    assert torus_shape(chips) == shape
    a, b, c = shape
    assert a * b * c == chips


@pytest.mark.parametrize("chips", [1, 2, 3, 6, 12, 24, 48, 96, 100, 320 + 32])
def test_invalid_torus_sizes(chips):
    assert torus_shape(chips) is None


def test_v7x_hosts_and_devices():
    topo = _topology(_tpu(256), None)
    assert (topo.hosts, topo.devices_per_host, topo.chips) == (64, 8, 256)
    assert topo.slice_shape == (4, 8, 8)
    assert topo.device_memory_bytes == 206158430208 / 2


def test_v5p_one_device_per_chip():
    topo = _topology(_tpu(64, hardware="v5p"), None)
    assert (topo.hosts, topo.devices_per_host) == (16, 4)


def test_gpu_whole_hosts_or_a_part_of_one():
    gpu = lambda n: make_config(hardware="h100", mesh={"kind": "gpu", "chips": n})  # noqa: E731
    assert _topology(gpu(24), None).hosts == 3
    topo = _topology(gpu(4), None)
    assert (topo.hosts, topo.devices_per_host) == (1, 4)
    for bad in (3, 12):
        with pytest.raises(PlanError) as err:
            _topology(gpu(bad), None)
        assert err.value.key == "mesh.chips" and err.value.rule_id == "whole_hosts"


def test_cpu_mesh_derives_chips():
    cfg = make_config(mesh={"kind": "cpu", "hosts": 3, "devices_per_host": 2})
    topo = _topology(cfg, None)
    assert (topo.hosts, topo.devices_per_host, topo.chips) == (3, 2, 6)
    with pytest.raises(PlanError) as err:
        _topology(make_config(mesh={"kind": "cpu", "hosts": 2, "chips": 4}), None)
    assert err.value.key == "mesh.chips" and err.value.rule_id == "derived"


@pytest.mark.parametrize("field", ["hosts", "devices_per_host"])
def test_tpu_mesh_rejects_fields_it_derives(field):
    with pytest.raises(PlanError) as err:
        _topology(_tpu(8, **{field: 2}), None)
    assert err.value.key == f"mesh.{field}" and err.value.value == 2


def test_platform_must_match_mesh_kind():
    cfg = make_config(hardware="h100", mesh={"kind": "tpu", "chips": 8})
    with pytest.raises(PlanError) as err:
        _topology(cfg, None)
    assert err.value.key == "hardware" and err.value.value == "h100"
    assert str(err.value).startswith("hardware=h100: platform gpu does not match")


def test_auto_uses_detected_devices_or_one_device():
    cfg = make_config(mesh={"kind": "auto"})
    assert _topology(cfg, None).devices == 1
    topo = _topology(cfg, DetectedTopology(hosts=4, devices_per_host=2))
    assert (topo.hosts, topo.devices_per_host, topo.chips) == (4, 2, 8)
    with pytest.raises(PlanError) as err:
        _topology(cfg, DetectedTopology(2, 4, platform="tpu", device_kind="TPU7x"))
    assert err.value.key == "hardware"

"""`mesh=auto`: one composition gives the hardware entry of the devices this run sees."""

import dataclasses

from compiler import DetectedTopology
from locojax.config.compose import CONF_DIR, compose_config
from locojax.config.detect import detect_topology, hardware_entry_for


def test_mesh_auto_is_the_detected_entry():
    auto = compose_config(["mesh=auto"]).hardware
    assert detect_topology().platform == "cpu"  # conftest: JAX_PLATFORMS=cpu
    assert auto == compose_config(["mesh=cpu"]).hardware


def test_mesh_auto_keeps_the_users_hardware_choices():
    tuned = compose_config(["mesh=auto", "hardware.cost.dispatch_s=0.5"]).hardware
    base = compose_config(["mesh=cpu"]).hardware
    assert tuned == dataclasses.replace(base, cost=dataclasses.replace(base.cost, dispatch_s=0.5))
    assert compose_config(["mesh=auto", "hardware=v7x"]).hardware.name == "v7x"


def test_the_entry_is_chosen_by_device_kind_then_platform():
    def entry(platform, kind):
        return hardware_entry_for(DetectedTopology(1, 4, platform, kind), CONF_DIR)

    assert entry("tpu", "TPU7x") == "v7x" and entry("tpu", "TPU v5") == "v5p"
    assert entry("gpu", "NVIDIA H100 80GB HBM3") == "h100"
    assert entry("gpu", "NVIDIA H200") == "h100"  # same platform, no exact entry
    assert entry("cpu", "cpu") == "cpu" and entry("cpu", "something else") == "cpu"

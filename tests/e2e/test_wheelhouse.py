"""`make wheelhouse` (scripts/wheelhouse.py): a target's tags, and leaving a package out leaves
what only it needs."""

import sys

import pytest
from paths import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import wheelhouse  # noqa: E402

pytestmark = pytest.mark.slow

UV_OUTPUT = """\
chex==0.1.92
    # via locojax (pyproject.toml)
jax==0.10.2
    # via
    #   chex
    #   locojax (pyproject.toml)
jaxlib==0.10.2
    # via jax
numpy==2.4.6
    # via
    #   jax
    #   jaxlib
    #   locojax (pyproject.toml)
ray==2.60.0
    # via locojax (pyproject.toml)
click==8.5.1
    # via ray
setuptools==84.2.1
    # via -r /tmp/build.in
"""


def test_a_target_names_every_tag_its_host_installs():
    tgt = wheelhouse.target("python3.11", "manylinux_2_28_x86_64")
    flags = tgt.pip_flags()
    platforms = {flags[i + 1] for i, f in enumerate(flags) if f == "--platform"}
    assert {"manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
            "manylinux1_x86_64"} <= platforms and "manylinux_2_29_x86_64" not in platforms
    assert flags[:4] == ["--python-version", "3.11", "--implementation", "cp"]
    assert tgt.uv_flags()[-1] == "x86_64-manylinux_2_28"
    # uv names no manylinux_2_27: the newest below it
    assert wheelhouse.target("3.11", "manylinux_2_27_aarch64").uv_flags()[-1] == \
        "aarch64-manylinux_2_17"
    assert wheelhouse.target("3.12", "manylinux2014_x86_64").glibc == 17
    for python, platform in (("python3", "manylinux_2_28_x86_64"), ("3.11", "macosx_14_0_arm64")):
        with pytest.raises(wheelhouse.WheelhouseError):
            wheelhouse.target(python, platform)


def test_leaving_a_package_out_leaves_what_only_it_needs():
    pins = wheelhouse.parse_lock(UV_OUTPUT)
    assert pins["jax"] == ("0.10.2", {"chex", ""}) and pins["setuptools"][1] == {""}
    parts = wheelhouse.split(pins, host_has={"jax", "jaxlib"}, skip={"ray"})
    # numpy stays: the project needs it itself; jaxlib only through jax, click through ray
    assert parts == {"wheels": {"chex", "numpy", "setuptools"}, "host_has": {"jax", "jaxlib"},
                     "skipped": {"ray", "click"}}
    assert wheelhouse.split(pins, set(), set())["wheels"] == set(pins)

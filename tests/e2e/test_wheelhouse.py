"""`make wheelhouse` and `make install-offline` (scripts/wheelhouse.py, scripts/install_offline.sh):
the pins name every distribution the project's venv needs (resolved by uv, nothing
downloaded), leaving a package out leaves what only it needs, the installer keeps the host's
versions that every requirement accepts and names what it cannot have in one line. The whole
path (a real wheelhouse, a fresh venv with no network, a run): scripts/offline_check.sh."""

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from paths import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import install_offline  # noqa: E402
import wheelhouse  # noqa: E402
from install_offline import Dist, Requirement  # noqa: E402

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


def test_the_pins_name_every_dependency_the_venv_has():
    """What `make wheelhouse EXTRAS=tpu` carries for this machine, resolved by uv (the
    registry's metadata, no wheel downloaded: ~4 s, 1 CPU-s; the `test` extra's trackers take
    ~14 s), names every distribution the venv's locojax[tpu] reaches through the installed
    metadata, walked as the installer walks it, and the build requirements."""
    if subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True).returncode:
        pytest.skip("no uv in this venv (make venv installs it)")
    here = wheelhouse.target(f"{sys.version_info[0]}.{sys.version_info[1]}", "")
    pins = wheelhouse.resolve(ROOT, here, ["tpu"])
    _, venv = install_offline.installed(sys.executable)
    needed = install_offline.needs(install_offline.project_requirements(ROOT, ["tpu"]), venv)
    assert len(needed) > 60 and {"jax", "ray", "libtpu", "antlr4-python3-runtime"} <= set(needed)
    assert set(needed) <= set(pins), sorted(set(needed) - set(pins))
    assert {"setuptools", "wheel"} <= set(pins)


def test_the_test_extra_unfolds_the_projects_own_extras():
    names = {r.name for r in install_offline.project_requirements(ROOT, ["test"])}
    assert {"jax", "pytest", "wandb", "mlflow", "reasoning-gym"} <= names
    assert "locojax" not in names and "libtpu" not in names


def _dist(name, version, *requires, file=""):
    return Dist(name, version, tuple(requires), file)


def test_the_installer_keeps_what_satisfies_every_requirement():
    roots = [Requirement("jax>=0.10,<0.11"), Requirement("flax"), Requirement("ray")]
    wheels = {"flax": _dist("flax", "0.12.8", "jax>=0.8", "typing-extensions>=4.2",
                            file="flax.whl"),
              "typing-extensions": _dist("typing-extensions", "4.16.0", file="te.whl")}
    host = {"jax": _dist("jax", "0.10.2", "jaxlib==0.10.2", "libtpu; extra == 'tpu'"),
            "jaxlib": _dist("jaxlib", "0.10.2"), "typing-extensions": _dist(
                "typing-extensions", "4.0.0")}
    manifest = {"host_has": {"jax": "0.10.2", "jaxlib": "0.10.2"}, "skipped": {"ray": "2.60"}}
    choice = install_offline.choose(roots, host, wheels, manifest)
    assert [d.name for d in choice.kept] == ["jax", "jaxlib"]
    assert [d.name for d in choice.install] == ["flax", "typing-extensions"]
    assert choice.replaced == ("typing-extensions",) and choice.left_out == ("ray",)
    assert not choice.problems
    # A host jax the project refuses, and no jax wheel; the host's jax without its jaxlib.
    old = host | {"jax": _dist("jax", "0.9.0", "jaxlib==0.9.0"),
                  "jaxlib": _dist("jaxlib", "0.9.0")}
    (problem,) = install_offline.choose(roots, old, wheels, manifest).problems
    assert problem.startswith("this host's jax 0.9.0 does not satisfy locojax: jax<0.11,>=0.10")
    (problem,) = install_offline.choose(roots, {"jax": host["jax"]}, wheels, manifest).problems
    assert problem == ("jaxlib (needed by jax: jaxlib==0.10.2) is neither installed here nor "
                       "in the wheelhouse (made with HOST_HAS)")


def _wheel(where: Path, name: str, version: str, *requires: str) -> str:
    """A one-module wheel of `name`, as pip installs it."""
    file = f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Requires-Dist: {r}\n" for r in requires)])
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n", f"{info}/METADATA": meta,
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(where / file, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return file


def _checkout(tmp_path: Path) -> Path:
    """A checkout with the two scripts, a pyproject needing demo_a (which needs demo_c) and
    demo_b>=2, and its wheelhouse of all three."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    for name in ("wheelhouse.py", "install_offline.py", "install_offline.sh"):
        shutil.copy2(ROOT / "scripts" / name, root / "scripts" / name)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "locojax"\ndependencies = ["demo_a>=1", "demo_b>=2"]\n')
    where = root / "wheelhouse"
    where.mkdir()
    wheels = {"demo-a": ("1.0", _wheel(where, "demo_a", "1.0", "demo_c")),
              "demo-b": ("2.0", _wheel(where, "demo_b", "2.0")),
              "demo-c": ("1.0", _wheel(where, "demo_c", "1.0"))}
    manifest = {"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "extras": [],
                "platform": "manylinux_2_36_x86_64", "built": [], "host_has": {},
                "skipped": {}, "wheels": {n: {"version": v, "file": f}
                                          for n, (v, f) in wheels.items()}}
    (where / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_install_offline_sh_keeps_the_hosts_and_names_a_missing_wheel(tmp_path):
    """`scripts/install_offline.sh --target`: the host's demo_b 3.0 (on PYTHONPATH) is kept,
    demo_a and demo_c installed from the wheelhouse with no index; with demo_c's wheel gone,
    one line naming it and exit 1."""
    root, host, site = _checkout(tmp_path), tmp_path / "host", tmp_path / "site"
    zipfile.ZipFile(tmp_path / _wheel(tmp_path, "demo_b", "3.0")).extractall(host)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": sys.executable,
           "PYTHONPATH": str(host)}
    cmd = [str(root / "scripts" / "install_offline.sh"), "--target", str(site)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "kept from this host: demo-b 3.0" in out.stdout, out.stdout
    assert sorted(p.name for p in site.glob("*.dist-info")) == [
        "demo_a-1.0.dist-info", "demo_c-1.0.dist-info"]
    assert f"export PYTHONPATH=$PYTHONPATH:{site}:{root}" in out.stdout
    (root / "wheelhouse" / "demo_c-1.0-py3-none-any.whl").unlink()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "has no wheel of demo-c 1.0" in out.stderr

"""`make wheelhouse`: every wheel the project needs for one Python and one Linux platform, in one
folder, for a host with no registry (`scripts/install_offline.sh` installs from it; docs/tpu.md).

    pyproject.toml (dependencies, --extras, build-system.requires)
      --uv pip compile for the target--> pins, each with what needs it
      --HOST_HAS / SKIP, and what only they need, left out--> pins to carry
      --pip download --no-deps --only-binary=:all: (no wheel published: pip wheel from the
        sdist, which must give a pure-Python wheel for a foreign target)--> <out>/*.whl
      --> <out>/manifest.json: the target, each wheel's file, what was left out and why

    .venv/bin/python scripts/wheelhouse.py [--python 3.11] [--platform manylinux_2_28_x86_64]
        [--extras test,tpu] [--host-has jax,jaxlib,libtpu] [--skip ray] [--out wheelhouse]
    .venv/bin/python scripts/wheelhouse.py --check [--out wheelhouse]

Needs the registry (uv resolves, pip downloads). Wheels in <out> that the pins no longer name
are removed. `--check` exits 1 naming each wheel the manifest lists and <out> lacks.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

try:
    from packaging.utils import parse_wheel_filename
    from packaging.version import Version
except ImportError:  # a bare venv or host: pip's own copy, there wherever pip is
    from pip._vendor.packaging.utils import parse_wheel_filename
    from pip._vendor.packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "manifest.json"
UV_GLIBC = (17, 28, *range(31, 41))
"""The manylinux glibc minors `uv pip compile --python-platform` names (uv 0.13)."""
LEGACY = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
"""PEP 599/571/513 names of manylinux_2_17, 2_12 and 2_5."""
ROOTS = ("locojax (pyproject.toml)", "-r ")
"""How uv's `# via` annotation names the project and the build requirements."""


class WheelhouseError(Exception):
    """What went wrong, in one line."""


def canonical(name: str) -> str:
    """PEP 503's normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Target:
    python: str
    """`3.11`."""
    glibc: int
    """The manylinux glibc minor: 28 for manylinux_2_28."""
    arch: str
    """`x86_64`, `aarch64`."""

    @property
    def platform(self) -> str:
        return f"manylinux_2_{self.glibc}_{self.arch}"

    def pip_flags(self) -> list[str]:
        """pip's flags for wheels this target installs: every older manylinux tag too (pip
        takes each tag literally) and the legacy names of 2_17, 2_12 and 2_5."""
        tags = [f"manylinux_2_{m}_{self.arch}" for m in range(self.glibc, 4, -1)]
        tags += [f"{name}_{self.arch}" for name, m in LEGACY.items() if m <= self.glibc]
        return ["--python-version", self.python, "--implementation", "cp",
                *(f for tag in tags for f in ("--platform", tag))]

    def uv_flags(self) -> list[str]:
        """uv's flags: the newest manylinux it names at or below this one."""
        below = [m for m in UV_GLIBC if m <= self.glibc]
        if not below:
            raise WheelhouseError(f"{self.platform}: uv resolves for manylinux_2_17 and newer")
        return ["--python-version", self.python,
                "--python-platform", f"{self.arch}-manylinux_2_{below[-1]}"]


def target(python: str, platform_tag: str) -> Target:
    """The target of `--python` (`3.11` or `python3.11`) and `--platform` (a manylinux tag;
    empty: this machine's glibc and architecture)."""
    version = re.search(r"(\d+\.\d+)$", python)
    if not version:
        raise WheelhouseError(f"--python {python!r}: say the version, e.g. 3.11")
    if not platform_tag:
        libc, glibc = platform.libc_ver()
        if libc != "glibc":
            raise WheelhouseError("this machine has no glibc: name the host's --platform "
                                  "(e.g. manylinux_2_28_x86_64)")
        platform_tag = f"manylinux_{glibc.replace('.', '_')}_{platform.machine()}"
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform_tag)
    legacy = re.fullmatch(r"(manylinux\w+?)_(\w+)", platform_tag)
    if m:
        return Target(version[1], int(m[1]), m[2])
    if legacy and legacy[1] in LEGACY:
        return Target(version[1], LEGACY[legacy[1]], legacy[2])
    raise WheelhouseError(f"--platform {platform_tag!r}: a manylinux tag, e.g. "
                          "manylinux_2_28_x86_64 (Linux hosts only)")


def build_requirements(root: Path) -> list[str]:
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["build-system"]["requires"]


def resolve(root: Path, tgt: Target, extras: list[str]) -> dict[str, tuple[str, set[str]]]:
    """{name: (version, what needs it)} for pyproject's dependencies with `extras` and the
    build requirements, resolved for `tgt` by `uv pip compile` (no wheel is downloaded)."""
    with tempfile.NamedTemporaryFile("w", suffix=".in") as build:
        build.write("\n".join(build_requirements(root)) + "\n")
        build.flush()
        out = subprocess.run(
            [sys.executable, "-m", "uv", "pip", "compile", "-q", "--no-header",
             "--annotation-style", "split", str(root / "pyproject.toml"), build.name,
             *tgt.uv_flags(), *(f for e in extras for f in ("--extra", e))],
            capture_output=True, text=True, cwd=root)
    if out.returncode:
        raise WheelhouseError("uv pip compile failed: " + last_error(out.stderr))
    return parse_lock(out.stdout)


def parse_lock(text: str) -> dict[str, tuple[str, set[str]]]:
    """uv's output, `name==version` lines with `# via` annotations -> {name: (version,
    {requirer, or '' for the project and the build requirements})}."""
    pins: dict[str, tuple[str, set[str]]] = {}
    name = ""
    for line in text.splitlines():
        pin = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line.strip())
        via = re.fullmatch(r"#\s+(?:via\s+)?(.+)", line.strip())
        if pin:
            name = canonical(pin[1])
            pins[name] = (pin[2], set())
        elif via and name and via[1] != "via":
            parent = via[1].strip()
            pins[name][1].add("" if parent.startswith(ROOTS) else canonical(parent))
    return pins


def split(pins: dict[str, tuple[str, set[str]]], host_has: set[str],
          skip: set[str]) -> dict[str, set[str]]:
    """{"wheels", "host_has", "skipped"}: names the project reaches without passing through
    a left-out one are carried; the rest are the host's if one of `host_has` needs them, else
    skipped."""
    def reach(starts: set[str], stop: set[str]) -> set[str]:
        seen, todo = set(), list(starts)
        while todo:
            name = todo.pop()
            if name not in seen and name not in stop:
                seen.add(name)
                todo += [n for n, (_, by) in pins.items() if name in by]
        return seen

    unknown = sorted((host_has | skip) - set(pins))
    if unknown:
        print(f"wheelhouse: not among the pins, nothing to leave out: {', '.join(unknown)}")
    carried = reach({n for n, (_, by) in pins.items() if "" in by}, host_has | skip)
    host = reach(host_has & set(pins), set()) - carried
    return {"wheels": carried, "host_has": host, "skipped": set(pins) - carried - host}


def last_error(stderr: str) -> str:
    """pip's or uv's last error line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(("ERROR", "error"))]
    return (errors or lines or ["(no output)"])[-1]


def download(pins: dict[str, str], tgt: Target, out: Path) -> set[str]:
    """Downloads the wheel of every pin; returns the names with no wheel for `tgt`, found one
    pip failure at a time (pip stops at the first)."""
    no_wheel: set[str] = set()
    while True:
        reqs = [f"{n}=={v}" for n, v in sorted(pins.items()) if n not in no_wheel]
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                              "--only-binary=:all:", *tgt.pip_flags(), "-d", str(out), *reqs],
                             capture_output=True, text=True)
        if got.returncode == 0:
            return no_wheel
        missing = re.search(r"No matching distribution found for ([A-Za-z0-9._-]+)==",
                            got.stderr)
        if not missing or canonical(missing[1]) in no_wheel:
            raise WheelhouseError("pip download failed: " + last_error(got.stderr))
        no_wheel.add(canonical(missing[1]))


def build(name: str, version: str, tgt: Target, out: Path) -> None:
    """The wheel of a project published as an sdist only, built here; for another Python or
    platform than this one's it must be pure Python."""
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                              "--no-binary", name, "-w", tmp, f"{name}=={version}"],
                             capture_output=True, text=True)
        if got.returncode:
            raise WheelhouseError(f"{name} {version} has no wheel for {tgt.platform} and its "
                                  f"sdist did not build: {last_error(got.stderr)}")
        (wheel,) = Path(tmp).glob("*.whl")
        here = target(f"{sys.version_info[0]}.{sys.version_info[1]}", "")
        if not wheel.name.endswith("-none-any.whl") and here != tgt:
            raise WheelhouseError(f"{name} {version} has no wheel for {tgt.platform} and its "
                                  f"sdist builds {wheel.name} here: make the wheelhouse on a "
                                  f"{tgt.platform} machine with Python {tgt.python}")
        wheel.rename(out / wheel.name)


def wheel_files(pins: dict[str, str], out: Path) -> dict[str, str]:
    """{name: file name} of the wheel of each pin in `out`; other wheels there are removed."""
    files = {}
    for path in sorted(out.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(path.name)
        if name in pins and Version(pins[name]) == version:
            files[name] = path.name
        else:
            path.unlink()
    return files


def make(args: argparse.Namespace) -> dict:
    """Resolves, leaves out, downloads, builds; writes and returns the manifest."""
    tgt = target(args.python, args.platform)
    extras = [e for e in args.extras.replace(",", " ").split() if e]
    pins = resolve(ROOT, tgt, extras)
    parts = split(pins, names(args.host_has), names(args.skip))
    carried = {n: pins[n][0] for n in parts["wheels"]}
    args.out.mkdir(parents=True, exist_ok=True)
    no_wheel = download(carried, tgt, args.out)
    for name in sorted(no_wheel):
        build(name, carried[name], tgt, args.out)
    files = wheel_files(carried, args.out)
    manifest = {"python": tgt.python, "platform": tgt.platform, "extras": extras,
                "wheels": {n: {"version": carried[n], "file": files.get(n, "")}
                           for n in sorted(carried)},
                "built": sorted(no_wheel),
                "host_has": {n: pins[n][0] for n in sorted(parts["host_has"])},
                "skipped": {n: pins[n][0] for n in sorted(parts["skipped"])}}
    (args.out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def names(text: str) -> set[str]:
    return {canonical(n) for n in text.replace(",", " ").split() if n}


def read_manifest(out: Path) -> dict:
    path = out / MANIFEST
    if not path.is_file():
        raise WheelhouseError(f"no {path}: run `make wheelhouse` on a machine with the registry "
                              "(docs/tpu.md)")
    return json.loads(path.read_text())


def missing(manifest: dict, out: Path) -> list[str]:
    """`name version` of each wheel the manifest lists and `out` lacks."""
    return [f"{n} {w['version']}" for n, w in manifest["wheels"].items()
            if not w["file"] or not (out / w["file"]).is_file()]


def summary(manifest: dict, out: Path) -> str:
    size = sum((out / w["file"]).stat().st_size for w in manifest["wheels"].values())
    left = [f"{kind} {', '.join(manifest[kind]) or '-'}" for kind in ("host_has", "skipped")]
    return (f"{out}: {len(manifest['wheels'])} wheels, {size / 2**20:.1f} MiB, Python "
            f"{manifest['python']} {manifest['platform']}, extras "
            f"{','.join(manifest['extras']) or '-'}; built {', '.join(manifest['built']) or '-'};"
            f" left out: {'; '.join(left)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=f"{sys.version_info[0]}.{sys.version_info[1]}")
    parser.add_argument("--platform", default="", help="a manylinux tag; default: this machine")
    parser.add_argument("--extras", default="", help="pyproject extras, e.g. test,tpu")
    parser.add_argument("--host-has", default="", help="names the host ships: left out")
    parser.add_argument("--skip", default="", help="names its runs do not need: left out")
    parser.add_argument("--out", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--check", action="store_true", help="only check <out> is complete")
    args = parser.parse_args(argv)
    try:
        manifest = read_manifest(args.out) if args.check else make(args)
        lacking = missing(manifest, args.out)
        if lacking:
            raise WheelhouseError(f"{args.out} lacks the wheel of {', '.join(lacking)}")
    except WheelhouseError as e:
        print(f"wheelhouse: {e}", file=sys.stderr)
        return 1
    print(summary(manifest, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

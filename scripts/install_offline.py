"""`scripts/install_offline.sh`: the project's dependencies from a wheelhouse (`make wheelhouse`)
with no index, keeping what this host already has at versions every requirement accepts (a TPU
image's jax, jaxlib and libtpu), into a venv or a `--target` folder (docs/tpu.md).

    <wheelhouse>/manifest.json, pyproject.toml (dependencies + the manifest's extras), each
    wheel's METADATA, the distributions the destination's Python already has
      --choose--> each needed name from the host if its version satisfies every requirement on
        it (the project's, the carried wheels', the kept ones'), else from the wheelhouse
      --> pip install --no-index --find-links <wheelhouse> --no-deps <wheels>
          (a venv: then the checkout, editable; a target: the checkout goes on PYTHONPATH)

    [PYTHON=python3] scripts/install_offline.sh [--venv DIR | --target DIR] [--wheelhouse DIR]

A venv that does not exist is created by $PYTHON with --system-site-packages, so that the
host's own packages are seen and kept. A needed package that neither the host (at a version
the requirements accept) nor the wheelhouse has ends the script with one line naming it
(exit 1); so does a wheel the manifest lists and the folder lacks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

import wheelhouse
from wheelhouse import WheelhouseError, canonical

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare host: pip's own copy, there wherever pip is
    from pip._vendor.packaging.requirements import Requirement

PROJECT = "locojax"
INSTALLED = """import importlib.metadata as m, json, sys
seen = [[d.metadata["Name"], d.version, d.requires or []] for d in m.distributions()]
print(json.dumps({"python": "%d.%d" % sys.version_info[:2], "dists": seen}))"""
"""Run by the destination's Python: its version and [name, version, Requires-Dist] of every
distribution it sees, in sys.path's order."""


@dataclass(frozen=True)
class Dist:
    name: str
    version: str
    requires: tuple[str, ...]
    """Requires-Dist lines."""
    file: str = ""
    """The wheel's file in the wheelhouse; '' for one the host has."""


@dataclass(frozen=True)
class Choice:
    install: tuple[Dist, ...]
    """Wheels to install."""
    kept: tuple[Dist, ...]
    """What the host has and keeps."""
    replaced: tuple[str, ...]
    """Names the host has at a version some requirement refuses: the wheel's is installed."""
    left_out: tuple[str, ...]
    """Needed names the wheelhouse skipped (`make wheelhouse SKIP=`) and the host lacks."""
    problems: tuple[str, ...]
    """Why the install cannot go on, one line each."""


def installed(python: str) -> tuple[str, dict[str, Dist]]:
    """The Python version of `python` and the distributions it has."""
    out = subprocess.run([python, "-c", INSTALLED], capture_output=True, text=True, check=True)
    found, dists = json.loads(out.stdout), {}
    for name, version, requires in found["dists"]:
        if name and canonical(name) != PROJECT:  # the first on sys.path is the one imported
            dists.setdefault(canonical(name), Dist(canonical(name), version, tuple(requires)))
    return found["python"], dists


def carried(manifest: dict, where: Path) -> dict[str, Dist]:
    """The wheels of the manifest, with the Requires-Dist of each one's METADATA."""
    lacking = wheelhouse.missing(manifest, where)
    if lacking:
        raise WheelhouseError(f"{where} has no wheel of {', '.join(lacking)}: make the "
                              "wheelhouse again (docs/tpu.md)")
    out = {}
    for name, wheel in manifest["wheels"].items():
        with zipfile.ZipFile(where / wheel["file"]) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            headers = HeaderParser().parsestr(z.read(meta).decode())
        out[name] = Dist(name, wheel["version"], tuple(headers.get_all("Requires-Dist") or ()),
                         wheel["file"])
    return out


def project_requirements(root: Path, extras: list[str]) -> list[Requirement]:
    """pyproject's dependencies and those of `extras`, the project's own extras unfolded."""
    with open(root / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    optional = project.get("optional-dependencies", {})
    out, todo, seen = [], ["", *extras], set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in optional.get(extra, ()) if extra else project["dependencies"]:
            req = Requirement(line)
            if canonical(req.name) == PROJECT:
                todo += sorted(req.extras)
            else:
                out.append(req)
    return out


def needs(roots: list[Requirement], dists: dict[str, Dist]) -> dict[str, list[tuple]]:
    """{name: [(requirer, Requirement)]} of every requirement reachable from `roots` through
    `dists`, markers evaluated on this machine with the extras asked of each distribution."""
    found: dict[str, list[tuple]] = {}
    extras: dict[str, set[str]] = {}
    todo = [(PROJECT, r) for r in roots if r.marker is None or r.marker.evaluate()]
    while todo:
        by, req = todo.pop()
        name = canonical(req.name)
        found.setdefault(name, []).append((by, req))
        asked = {"", *req.extras}
        if name in extras and asked <= extras[name]:
            continue
        extras[name] = extras.get(name, set()) | asked
        for line in dists[name].requires if name in dists else ():
            r = Requirement(line)
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras[name]):
                todo.append((name, r))
    return found


def unmet(dist: Dist, reqs: list[tuple]) -> list[str]:
    """`requirer: requirement` of each of `reqs` that `dist`'s version does not satisfy (a
    version PEP 440 cannot read, as some system packages have, satisfies none)."""
    def accepts(req: Requirement) -> bool:
        try:
            return req.specifier.contains(dist.version, prereleases=True)
        except ValueError:  # packaging's InvalidVersion
            return False

    return [f"{by}: {req}" for by, req in reqs if not accepts(req)]


def choose(roots: list[Requirement], host: dict[str, Dist], wheels: dict[str, Dist],
           manifest: dict) -> Choice:
    """The host's version of each needed name where it satisfies every requirement on it (the
    kept ones' own requirements included), else the wheel's; what cannot be had."""
    chosen = {**wheels, **host}
    while True:
        found = needs(roots, chosen)
        replace = [n for n, reqs in found.items() if n in chosen and not chosen[n].file
                   and n in wheels and unmet(chosen[n], reqs)]
        if not replace:
            break
        chosen.update({n: wheels[n] for n in replace})
    problems, left_out = [], []
    for name, reqs in sorted(found.items()):
        dist = chosen.get(name)
        if dist is None and name in manifest["skipped"]:
            left_out.append(name)
        elif dist is None:
            made = " (made with HOST_HAS)" if name in manifest["host_has"] else ""
            problems.append(f"{name} (needed by {reqs[0][0]}: {reqs[0][1]}) is neither "
                            f"installed here nor in the wheelhouse{made}")
        elif unmet(dist, reqs):
            whose = "the wheelhouse's" if dist.file else "this host's"
            problems.append(f"{whose} {name} {dist.version} does not satisfy "
                            f"{'; '.join(unmet(dist, reqs))}, and the wheelhouse has no other")
    picked = [chosen[n] for n in sorted(found) if n in chosen]
    install = tuple(d for d in picked if d.file)
    return Choice(install, tuple(d for d in picked if not d.file),
                  tuple(d.name for d in install if d.name in host), tuple(left_out),
                  tuple(problems))


def pip_install(python: str, where: Path, args: list[str]) -> None:
    """pip with the wheelhouse as its only source: no index, no config file, no PIP_*."""
    cmd = [python, "-m", "pip", "install", "--isolated", "--no-index", "--find-links",
           str(where), "--no-deps", "--no-compile", "-q", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    out = subprocess.run(cmd, capture_output=True, text=True,
                         env=env | {"PIP_CONFIG_FILE": os.devnull})
    if out.returncode:
        raise WheelhouseError("pip install failed: " + wheelhouse.last_error(out.stderr))


def destination(args: argparse.Namespace) -> str:
    """The Python that installs: this one for --target, the venv's (created if missing)."""
    if args.target:
        return sys.executable
    python = args.venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(args.venv)],
                       check=True)
    return str(python)


def install(args: argparse.Namespace) -> Choice:
    """Chooses, installs and returns what it chose."""
    manifest = wheelhouse.read_manifest(args.wheelhouse)
    wheels = carried(manifest, args.wheelhouse)
    python = destination(args)
    version, host = installed(python)
    if version != manifest["python"]:
        raise WheelhouseError(f"{args.wheelhouse} is for Python {manifest['python']}, {python} "
                              f"is {version}: PYTHON=python{manifest['python']} or make the "
                              f"wheelhouse with PY={version}")
    choice = choose(project_requirements(wheelhouse.ROOT, manifest["extras"]), host, wheels,
                    manifest)
    if choice.problems:
        raise WheelhouseError(choice.problems[0])
    files = [str(args.wheelhouse / d.file) for d in choice.install]
    into = ["--target", str(args.target), "--upgrade"] if args.target else []
    if files:
        pip_install(python, args.wheelhouse, [*into, *files])
    if not args.target:
        pip_install(python, args.wheelhouse, ["-e", str(wheelhouse.ROOT)])
    return choice


def report(args: argparse.Namespace, choice: Choice, seconds: float) -> None:
    where = args.target or args.venv
    kept = ", ".join(f"{d.name} {d.version}" for d in choice.kept) or "nothing"
    print(f"install_offline: {len(choice.install)} wheels into {where} in {seconds:.1f} s; "
          f"kept from this host: {kept}")
    if choice.left_out:
        print(f"install_offline: left out of the wheelhouse (SKIP) and not here: "
              f"{', '.join(choice.left_out)}; runs that import them fail")
    if args.target:
        path = f"{args.target}:$PYTHONPATH" if choice.replaced else f"$PYTHONPATH:{args.target}"
        first = f"  # first: it replaces this host's {', '.join(choice.replaced)}"
        print(f"export PYTHONPATH={path}:{wheelhouse.ROOT}{first if choice.replaced else ''}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=wheelhouse.ROOT / ".venv")
    parser.add_argument("--target", type=Path, help="a folder for PYTHONPATH instead of a venv")
    parser.add_argument("--wheelhouse", type=Path, default=wheelhouse.ROOT / "wheelhouse")
    args = parser.parse_args(argv)
    args.wheelhouse, start = args.wheelhouse.resolve(), time.monotonic()
    try:
        choice = install(args)
    except WheelhouseError as e:
        print(f"install_offline: {e}", file=sys.stderr)
        return 1
    report(args, choice, time.monotonic() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A local Ray cluster reachable from this machine only: Ray's servers bound to loopback.

Ray's gRPC servers (GCS, raylet, workers, the driver's core worker) always listen on the
wildcard address, and Ray refuses 127.0.0.1 as a node address (it swaps in the machine's IP).
So a run's local cluster takes the node address `BIND_IP` (127.0.0.2: loopback, which Ray
keeps), and the shim `loopback_bind.c`, preloaded (LD_PRELOAD) into Ray's processes and the
driver, turns each wildcard bind() into a bind to it while `LOCOJAX_BIND_IP` is set:

    locojax (cli) --composed, compiled: the plan starts a local Ray cluster (DA, the single
        controller, no LOCOJAX_RAY_ADDRESS; `ray_cluster.starts_local_cluster`)-->
        re-exec once with LD_PRELOAD=<shim> (the same command, its run directory pinned; a
        `-m` sweep: before its first job). Other runs (CO, plan only, a joined cluster, whose
        driver must stay reachable) never pay for the second start-up.
    ray_cluster (local) --loopback()--> LOCOJAX_BIND_IP=127.0.0.2 while ray.init starts Ray's
        processes (they inherit it and LD_PRELOAD) and the driver's server binds; restored after

The shim is compiled on first use with the system C compiler ($CC, else cc/gcc/clang; ~0.3 s)
into `$LOCOJAX_CACHE_DIR/loopback` (default ~/.cache/locojax/loopback), keyed by its source.
Without a compiler (or with LOCOJAX_LOOPBACK=0) Ray listens on every interface as it would,
said in one line; Ray's token authentication (ray_cluster) still refuses strangers. A driver
not started through the `locojax` command (tests calling `run_da` in process) binds its own
server to the wildcard address; the processes Ray starts still bind to loopback.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

BIND_IP = "127.0.0.2"
"""The node address of a local cluster: loopback, and not one Ray replaces (127.0.0.1)."""
ENV_BIND = "LOCOJAX_BIND_IP"
ENV_SWITCH = "LOCOJAX_LOOPBACK"
"""Set to 0 to leave Ray's binds alone (no shim)."""
ENV_REEXEC = "LOCOJAX_REEXEC"
"""Set in the re-executed command: never a second re-exec."""
_SOURCE = Path(__file__).with_name("loopback_bind.c")


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def shim() -> tuple[Path | None, str]:
    """(the shim's shared library, '') built or cached, or (None, why not)."""
    if os.environ.get(ENV_SWITCH) == "0" or not sys.platform.startswith("linux"):
        return None, f"{ENV_SWITCH}=0 or not Linux"
    source = _SOURCE.read_bytes()
    root = Path(os.environ.get("LOCOJAX_CACHE_DIR") or "~/.cache/locojax").expanduser()
    lib = root / "loopback" / f"{hashlib.sha256(source).hexdigest()[:16]}.so"
    if lib.is_file():
        return lib, ""
    cc = _compiler()
    if cc is None:
        return None, "no C compiler ($CC, cc, gcc, clang) to build the loopback shim"
    lib.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
    os.close(fd)
    out = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", tmp, str(_SOURCE), "-ldl"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        os.unlink(tmp)
        return None, f"{cc} failed on {_SOURCE.name}: {out.stderr.strip()[:200]}"
    os.replace(tmp, lib)
    return lib, ""


def _preload_list(lib: Path) -> str:
    current = [p for p in os.environ.get("LD_PRELOAD", "").split() if p]
    return " ".join([str(lib), *[p for p in current if p != str(lib)]])


def preloaded(lib: Path) -> bool:
    """Whether this process was started with `lib` preloaded."""
    with contextlib.suppress(OSError):
        return str(lib) in Path("/proc/self/maps").read_text()
    return False


def reexec_preloaded(argv: list[str] | None = None) -> None:
    """Re-exec this command (`argv`, default `sys.orig_argv`) once with the shim preloaded
    (inert until `loopback`); a no-op when it is already, or when it cannot be built
    (`loopback` says so when Ray starts)."""
    lib, _ = shim()
    if lib is None or preloaded(lib) or os.environ.get(ENV_REEXEC) == "1":
        return
    env = {**os.environ, "LD_PRELOAD": _preload_list(lib), ENV_REEXEC: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(argv or sys.orig_argv), env)


HYDRA_PLAIN = re.compile(r"[\w./@%+-]*")
"""Characters a value may hold unquoted in a Hydra override (anything else: quoted)."""


def hydra_value(text: str) -> str:
    """`text` as the value of a Hydra override parses back to it: as it is when plain, else
    single-quoted with its quotes and interpolation marks escaped (a path with a space, a
    comma or parentheses: `'/runs/run (1)'`)."""
    if HYDRA_PLAIN.fullmatch(text):
        return text
    # Hydra unescapes backslashes only before a quote or at the end of a quoted string.
    doubled = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, text)
    return "'" + doubled.replace("'", "\\'").replace("${", "\\${") + "'"


def pinned_run_dir(argv: list[str], run_dir: str) -> list[str]:
    """`argv` with `hydra.run.dir=<run_dir>` (quoted for Hydra where it needs it) in place of
    any the user gave: the re-executed command, or an emulated host, writes into the
    directory this one made (the default holds the time of day)."""
    kept = [a for a in argv if not a.lstrip("+~").startswith("hydra.run.dir=")]
    return [*kept, f"hydra.run.dir={hydra_value(run_dir)}"]


@contextlib.contextmanager
def restored_env(keys) -> Iterator[None]:
    """Whatever the block sets or removes of `keys` in os.environ is undone after it (tests
    start several clusters in one process)."""
    saved = {k: os.environ.get(k) for k in keys}
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def loopback(log=print) -> Iterator[str | None]:
    """Yields the node address for `ray.init` (None: the shim cannot be built; one line
    says so) with `LOCOJAX_BIND_IP` and LD_PRELOAD set for the processes Ray starts."""
    lib, why = shim()
    if lib is None:
        log(f"Ray listens on every interface ({why}); its token authentication refuses "
            "other clients")
        yield None
        return
    with restored_env(("LD_PRELOAD", ENV_BIND)):
        os.environ.update(LD_PRELOAD=_preload_list(lib), **{ENV_BIND: BIND_IP})
        yield BIND_IP

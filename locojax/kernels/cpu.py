"""CPU kernels for the rollout decode loop, as XLA FFI calls (`cpu_kernels.cc`).

    W_KxN --pack_panels (once, before a decode loop)--> Panels(panels_PxKx64)
    panel_matmul(x_...xK, Panels) --> rows x panels, panels shared out over XLA's CPU
                                      threads --> y_...xN (fp32)
    q, keys^T, values, valid --decode_attention--> softmax(q K^T) V over the written slots

Why: every decode step multiplies 16-odd rows by each weight matrix, and the weights (~27 MB
at the benchmark's size) do not stay in cache, so each step streams them from memory. XLA's
CPU dot reads a KxN weight a column block at a time, one row of the block per 4 KB page; the
panel matmul reads contiguous K x 64 panels front to back. Measured on the 2-core benchmark
machine with four 256 x 8,192 weights read in turn (8 MB each): XLA's dot 605-619 us per
matmul, the kernel 452 us on two threads. XLA's decode attention reads every cache slot
(written or not) in four passes (scores, max/exp, sum, values); the kernel reads only the
slots up to each row's last valid one, once for keys and once for values (+7.7% tokens/s on
the benchmark workload, paired).

The library is compiled on first use with the system C++ compiler (`$CXX`, else g++, c++ or
clang++; -O3 -march=native -Wall -Wextra, compiler warnings logged) against jaxlib's FFI
headers (~3 s) and cached in
`$LOCOJAX_CACHE_DIR/kernels` (default `~/.cache/locojax/kernels`), keyed by the source,
jaxlib's version, the compiler and the CPU. Without a compiler, on a non-CPU backend, or with
`LOCOJAX_CPU_KERNELS=0`, `available()` is False (`unavailable_reason()` says why) and callers
keep XLA's ops.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

log = logging.getLogger(__name__)

PANEL = 64
"""Columns per panel (four 16-float vectors); N must be a multiple of it."""
TARGET = "locojax_panel_matmul"
"""Name of the FFI target of the panel matmul."""
PACK_TARGET = "locojax_pack_panels"
"""Name of the FFI target that packs a weight into panels. Made by XLA from a tied embedding
(transpose, then reshape and transpose) the 8,192 x 256 panels took two copies, 15 ms; this
takes 1 ms."""
ATTENTION_TARGET = "locojax_decode_attention"
"""Name of the FFI target of one decode step's attention."""
DISABLE_ENV = "LOCOJAX_CPU_KERNELS"
"""Set to 0 to keep XLA's ops everywhere (A/B comparisons, debugging)."""
ISA_ENV = "LOCOJAX_CPU_KERNELS_ISA"
"""`avx2`: build the 8-float-vector register tile (no AVX-512) on any x86 CPU, to time an
AVX2 machine's kernels on an AVX-512 one (with `XLA_FLAGS=--xla_cpu_max_isa=AVX2` for XLA's
side); unset: the tile of this CPU (-march=native)."""
_SOURCE = Path(__file__).with_name("cpu_kernels.cc")
_SPLIT_MIN_ITEMS = 4
"""Fewer work items (panels, or attention's row x kv head pairs) than this run on the calling
thread alone (a pool task costs more)."""


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Panels:
    """A KxN fp32 weight stored as P = N/64 contiguous K x 64 panels, for `panel_matmul`.

    `out_shape` is what the N columns stand for (a q projection's (heads, head_dim)): the
    product of a ...xK input is ...x out_shape.
    """

    panels_PxKx64: jax.Array
    out_shape: tuple[int, ...] = field(metadata=dict(static=True))

    @property
    def shape(self) -> tuple[int, int]:
        """(K, N) of the weight this packs."""
        p, k, _ = self.panels_PxKx64.shape
        return k, p * PANEL


def pack_panels(w: jax.Array, transposed: bool = False,
                out_shape: tuple[int, ...] | None = None) -> Panels:
    """The panel layout of W (one copy): `w` is W_KxN, or W_NxK with `transposed` (e.g. a
    tied embedding used as the output matrix). N must be a multiple of 64; `out_shape`
    (default (N,)) what its columns stand for."""
    k, n = w.shape[::-1] if transposed else w.shape
    if not packable(w, transposed):
        raise ValueError(f"pack_panels: need an fp32 matrix with N a multiple of {PANEL}; "
                         f"got {w.dtype} {w.shape} (transposed={transposed})")
    out_shape = (n,) if out_shape is None else tuple(out_shape)
    if int(np.prod(out_shape)) != n:
        raise ValueError(f"pack_panels: out_shape {out_shape} does not hold the {n} columns")
    call = jax.ffi.ffi_call(PACK_TARGET,
                            jax.ShapeDtypeStruct((n // PANEL, k, PANEL), jnp.float32))
    return Panels(call(w, transposed=transposed, split=np.int64(_split(n // PANEL))), out_shape)


def packable(w: jax.Array, transposed: bool = False) -> bool:
    """True if `w` is an fp32 matrix whose N (columns, or rows if transposed) is a multiple
    of 64."""
    return w.ndim == 2 and w.dtype == jnp.float32 and w.shape[0 if transposed else 1] % PANEL == 0


def panel_matmul(x_xK: jax.Array, w: Panels) -> jax.Array:
    """x_...xK @ W -> ...x w.out_shape in fp32 through the panel matmul (`available()` first)."""
    k, n = w.shape
    if x_xK.shape[-1] != k:
        raise ValueError(f"panel_matmul: x has {x_xK.shape[-1]} columns, the weight {k} rows")
    lead = x_xK.shape[:-1]
    x_MxK = x_xK.reshape(-1, k).astype(jnp.float32)
    panels = w.panels_PxKx64.shape[0]
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((x_MxK.shape[0], n), jnp.float32))
    y_MxN = call(x_MxK, w.panels_PxKx64, split=np.int64(_split(panels)))
    return y_MxN.reshape(*lead, *w.out_shape)


def decode_attention(q_BxKxGxhd: jax.Array, keys_BxKxhdxS: jax.Array,
                     values_BxKxSxhd: jax.Array, valid_BxS: jax.Array, scale: float) -> jax.Array:
    """softmax(scale * q K^T, valid slots) V for one decode step -> BxKxGxhd (fp32).

    Reads only slots [0, 1 + last valid slot) of each row (a row with none valid weighs all
    slots alike, as a masked softmax does). Call `available()` first.
    """
    b, k = q_BxKxGxhd.shape[:2]
    call = jax.ffi.ffi_call(ATTENTION_TARGET,
                            jax.ShapeDtypeStruct(q_BxKxGxhd.shape, jnp.float32))
    return call(q_BxKxGxhd.astype(jnp.float32), keys_BxKxhdxS.astype(jnp.float32),
                values_BxKxSxhd.astype(jnp.float32), valid_BxS.astype(bool),
                scale=np.float32(scale), split=np.int64(_split(b * k)))


def _split(items: int) -> int:
    """Threads to share `items` out over: XLA's CPU pool size, or 1 for a few items."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 1 if items < _SPLIT_MIN_ITEMS else max(1, min(cores or 1, 8))


class _Unavailable(Exception):
    """The kernel cannot be built or loaded here (the message says why)."""


@functools.cache
def _cpu_id() -> str:
    """CPU model and feature flags (-march=native code is only valid on a matching CPU); read
    once per process (the rollout asks on every generation)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    keys = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in info.splitlines() if line.startswith(keys)}))


def register_tiles_fit(cpu_id: str | None = None) -> str | None:
    """None where `auto` runs the kernels (a CPU with AVX-512), else why not.

    The library is built for the CPU it runs on, with the register tile its vectors hold
    (`cpu_kernels.cc`): AVX-512's 6 rows x 64 columns (24 16-float accumulators of its 32
    registers), or on narrower vectors 6 rows x 16 columns (12 8-float accumulators + 3 of
    AVX2's 16). The first spilled on AVX2 (a 2-core AVX2 AMD EPYC, 2026-12-04: 16 x 256 x
    8,192 in 13.1 ms against XLA's 0.93 ms); the second is not measured on an AVX2 CPU (on
    an AVX-512 one, built without AVX-512, it lost to XLA's dot on 3 of 4 shapes:
    docs/cpu-kernels.md), so `auto` keeps XLA's ops there; `on` runs it (tests, A/B)."""
    flags = (cpu_id if cpu_id is not None else _cpu_id()).split()
    if "avx512f" in flags:
        return None
    return ("the CPU has no AVX-512; the kernels' narrower register tile is not measured to "
            "beat XLA's dot there")


def _build() -> Path:
    """Path of the compiled kernel library, compiling it into the cache if needed."""
    cxx = os.environ.get("CXX") or next(
        (c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)
    if cxx is None:
        raise _Unavailable("no C++ compiler found (g++, c++ or clang++; or set CXX)")
    include = jax.ffi.include_dir()
    source = _SOURCE.read_bytes()
    arch_flags = ["-march=native" if platform.machine() in ("x86_64", "AMD64")
                  else "-mcpu=native"]
    if os.environ.get(ISA_ENV, "").strip().lower() == "avx2":
        arch_flags.append("-mno-avx512f")
    key = hashlib.sha256(b"\0".join([
        source, jax.lib.__version__.encode(), cxx.encode(), _cpu_id().encode(),
        " ".join(arch_flags).encode()])).hexdigest()
    root = os.environ.get("LOCOJAX_CACHE_DIR") or "~/.cache/locojax"
    path = Path(root).expanduser() / "kernels" / f"cpu_kernels-{key[:16]}.so"
    if path.exists():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".cpu_kernels.", suffix=".so", dir=path.parent)
    except OSError as err:
        raise _Unavailable(f"cannot write the kernel cache {path.parent}: {err}") from err
    os.close(fd)
    # jaxlib's headers as system headers: their own warnings stay out, ours are all shown.
    cmd = [cxx, "-O3", *arch_flags, "-std=c++17", "-shared", "-fPIC", "-Wall", "-Wextra",
           "-isystem", include, str(_SOURCE), "-o", tmp]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["(no output)"])[0]
            raise _Unavailable(f"compiling {_SOURCE.name} failed: {first}")
        if done.stderr.strip():
            log.warning("compiling %s: compiler warnings:\n%s", _SOURCE.name, done.stderr.strip())
        log.info("compiled %s in %s", _SOURCE.name, path)
        os.replace(tmp, path)  # atomic: concurrent builders all publish a complete library
    except (OSError, subprocess.TimeoutExpired) as err:
        raise _Unavailable(f"compiling {_SOURCE.name} failed: {err}") from err
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


@functools.cache
def _load() -> str | None:
    """Build, load and register the kernels once per process; None, or why they are unavailable."""
    if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"disabled by {DISABLE_ENV}={os.environ[DISABLE_ENV]}"
    if jax.default_backend() != "cpu":
        return f"the default backend is {jax.default_backend()}, not cpu"
    try:
        library = ctypes.cdll.LoadLibrary(str(_build()))
    except _Unavailable as err:
        return str(err)
    except OSError as err:
        return f"loading the kernels failed: {err}"
    for name, symbol in ((TARGET, library.LocojaxPanelMatmul),
                         (PACK_TARGET, library.LocojaxPackPanels),
                         (ATTENTION_TARGET, library.LocojaxDecodeAttention)):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(symbol), platform="cpu")
    return None


def available() -> bool:
    """True once the kernels are built and registered (the first call compiles them, ~3 s)."""
    return _load() is None


def unavailable_reason() -> str | None:
    """Why `available()` is False, or None when it is True."""
    return _load()

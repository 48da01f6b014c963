"""Test-wide setup: CPU devices for multi-device tests, set before JAX is imported; a persistent
compilation cache and Python's bytecode, shared by every test and subprocess; the xdist groups
of `make test` (3 workers)."""

import os
import sys

import pytest

from locojax.runtime.process.job import with_device_count  # imports no JAX

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA's CPU backend at optimisation level 0 in this process (the same HLO and passes, LLVM's
# code generation not optimised: the in-process tests compile about 25% faster, docs/testing.md),
# 8 devices, and a run's waits for a late device thread (job.CPU_COLLECTIVE_FLAGS). The
# `python -m locojax` children take shared_runs.CHILD_XLA_FLAGS instead.
os.environ["XLA_FLAGS"] = with_device_count(
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0", 8)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Persistent XLA compilation cache: many tests build the same small programs, in process and in
# the `python -m locojax` subprocesses, which inherit these variables. Every program is cached,
# however quick its compile or small its entry (docs/testing.md: the hit counts). It lives in
# the clone, so a clean clone starts cold.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.dirname(__file__)), ".pytest_cache", "jax"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

# Python's bytecode, written once and read by every process the suite starts (runs, hosts,
# Ray's actors, reward workers), in .pytest_cache/pyc rather than beside the sources. Under
# PYTHONDONTWRITEBYTECODE=1 with a venv installed `--no-compile` (CI's), each of those processes
# compiled every module it imports from source again: ~8 of a 6-step run's ~23 CPU-seconds
# (docs/testing.md).
PYC = os.path.join(os.path.dirname(os.path.dirname(__file__)), ".pytest_cache", "pyc")
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ["PYTHONPYCACHEPREFIX"] = PYC
sys.dont_write_bytecode, sys.pycache_prefix = False, PYC

GROUPS = ("ray", "tpu")
"""Markers whose tests run on one xdist worker, one after another (`--dist loadgroup`): `ray`
starts a local Ray cluster of 3-4 processes, `tpu` loads libtpu or compiles Qwen3-0.6B-wide
programs (1-5 GB each). Two at once would oversubscribe 2 cores and 24 GiB; other tests run
beside them."""


@pytest.hookimpl(tryfirst=True)  # before xdist's, which turns the marker into the group
def pytest_collection_modifyitems(config, items):
    for item in items:
        for group in GROUPS:
            if item.get_closest_marker(group):
                item.add_marker(pytest.mark.xdist_group(group))

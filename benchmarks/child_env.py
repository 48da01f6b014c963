"""The environment of the runs a benchmark starts: the caller's, less the device-count flag.

    caller's env --(drop --xla_force_host_platform_device_count)--> child's env (+ extras)

A run decides its own devices (mesh=cpu emulates hosts with one device each); a caller's
other XLA flags (an optimisation level, a dump directory) reach the runs as given. The test
suite starts the benchmarks' smoke runs with its children's flags (tests/shared_runs.py)."""

from __future__ import annotations

import os

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def child_env(**extra: str) -> dict[str, str]:
    """os.environ without DEVICE_COUNT_FLAG in XLA_FLAGS (removed when nothing is left), with
    `extra` on top."""
    env = dict(os.environ)
    flags = [f for f in env.pop("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT_FLAG)]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    return env | extra

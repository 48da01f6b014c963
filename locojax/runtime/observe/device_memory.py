"""The peak device memory this process has used so far, for a CO step's row (accelerators
only: a CPU backend keeps no such statistic).

    peak_bytes() -> the first local device's `peak_bytes_in_use`, or None
"""

from __future__ import annotations

import jax


def peak_bytes() -> int | None:
    """`peak_bytes_in_use` of this process's first local device since it started (None where
    the backend keeps no statistics: a CPU)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else int(peak)

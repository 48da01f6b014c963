"""XLA programs this process compiled (or loaded from the compilation cache), counted from
JAX's own monitoring event, for the `compiles` column of a step's row (CO: the host's; the
single controller: its busiest worker's; 0 after the first step: shapes are static, so a
later compile is a recompile to find).

    COMPILES.take() -> programs since the last take (the first take: since import)
"""

from __future__ import annotations

import threading

import jax
from jax._src import dispatch


class CompileCounter:
    """Counts `dispatch.BACKEND_COMPILE_EVENT`s, the event JAX records around every backend
    compile (persistent-cache hits included)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **kwargs) -> None:
        if event == dispatch.BACKEND_COMPILE_EVENT:
            with self._lock:
                self._count += 1

    def take(self) -> int:
        """Programs compiled since the previous call."""
        with self._lock:
            count, self._count = self._count, 0
        return count


COMPILES = CompileCounter()

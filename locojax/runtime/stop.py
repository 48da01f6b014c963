"""SIGTERM and SIGINT end a run after saving the step in progress.

    StopSignals() around the loop    the first SIGTERM / SIGINT only sets a flag; a second (1 s
                                     or more later) stops at once (SIGINT: KeyboardInterrupt, exit 130;
                                     SIGTERM: the default action, killed, 143)
    each step boundary               `stop.flag` rides in the statistics all-gather the
                                     loop does anyway (CO), so every host sees every host's
                                     flag at the same step and all stop after it
    then                             the trainer saves that step and waits for it; `Stopped`
                                     (one line, exit 128 + the signal: 143 / 130)

Why a flag in the all-gather and not JAX's preemption sync
(`multihost_utils.reached_preemption_sync_point`): that needs jax.distributed with its
preemption service, answers SIGTERM only (not Ctrl-C), installs its own C++ SIGTERM handler,
and does not exist in a single-process run; the loop's per-step all-gather is already there,
so agreeing on the step costs one float per host and no extra collective.

Bound: the step in progress finishes (rollout and train), then one checkpoint is written
and committed; on preemptible capacity choose a step plus a save that fit the notice
period (30 s on GCP and AWS spot VMs). The local launcher gives its hosts
`STOP_GRACE_S` before it kills them.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

STOP_GRACE_S = 120.0
"""Seconds the local launcher waits after forwarding SIGTERM for its hosts to save and exit."""
SIGNALS = (signal.SIGTERM, signal.SIGINT)
DUPLICATE_S = 1.0
"""A second signal this soon after the first is the same stop delivered twice: a signal to a
process group reaches a joined host directly and through its supervisor
(`locojax.launch.fatal.watch` passes signals on), and Slurm signals every process of a step.
Only a later one stops at once."""


class Stopped(Exception):
    """The run stopped on a signal after saving; its one line says which step was saved."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name} after step {step}; checkpoint saved: "
                         f"{checkpoint}; resume with the same command")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """128 + the signal: 143 for SIGTERM, 130 for SIGINT."""
        return 128 + self.signum


class StopSignals:
    """Context manager: SIGTERM / SIGINT set `signum` instead of ending the process."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._first_at = 0.0
        self._old: dict[int, object] = {}

    def _handle(self, signum: int, _frame) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum, self._first_at = signum, now
            return
        if now - self._first_at < DUPLICATE_S:
            return  # the same stop delivered twice (a process group's signal, passed on too)
        self.__exit__()  # a second signal: stop at once, without the save
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old = {}

    @property
    def flag(self) -> float:
        """This process's vote at a step boundary: the signal number, 0 when none came."""
        return float(self.signum or 0)


def agreed_signal(flags: list[float]) -> int | None:
    """The signal every host stops on, from every host's `flag` (None: keep going). SIGTERM
    wins over SIGINT when hosts got different ones (the preemption notice)."""
    got = {int(f) for f in flags if f}
    if not got:
        return None
    return signal.SIGTERM if signal.SIGTERM in got else min(got)

"""SIGTERM, SIGINT and SIGHUP end a run after saving the step in progress, or at once outside
the steps. SIGHUP (the terminal or the ssh session that started the run closed) is answered as
SIGTERM is: the step saved, one line, exit 129.

    install() at the entry point   before the RL steps (start-up, compilation, restore, the
                                   supervised warm-up) and after them (the final export) a
                                   signal raises `Interrupted` (a KeyboardInterrupt, so every
                                   `finally` runs: Ray shut down, files closed): one line,
                                   exit 128 + the signal; nothing is saved (no RL step ran
                                   since the last checkpoint), and `atomic()` sections (a
                                   run-directory write, a save being committed) finish first

    StopSignals() around the loop    the first SIGTERM / SIGINT only sets a flag; a second (1 s
                                     or more later) stops at once (SIGINT: KeyboardInterrupt, exit 130;
                                     SIGTERM: the default action, killed, 143)
    each step boundary               `stop.flag` rides in the statistics all-gather the
                                     loop does anyway (CO), so every host sees every host's
                                     flag at the same step and all stop after it
    then                             the trainer saves that step and waits for it; `Stopped`
                                     (one line, exit 128 + the signal: 143 / 130)
    after the last step              the loop votes once more (a signal during the last step's
                                     evaluation or row): saved, `Stopped`, no export; one
                                     that comes later still is handed on to `final_export`
    final_export()                   a signal waits for the export, then "the run is
                                     complete"; after it, "stopped by SIGTERM after the run
                                     finished; everything is saved" (exit 143 / 130)
    runtime.loop                     the one loop of every mode asks these at each step's
                                     end (a Ray driver is the one process the signal
                                     reaches: its flag is the vote; its actors save)

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

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

STOP_GRACE_S = 120.0
"""Seconds the local launcher waits after forwarding SIGTERM for its hosts to save and exit."""
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""The signals a run answers with a save and one line (exit 128 + the signal)."""
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
        """128 + the signal: 143 for SIGTERM, 130 for SIGINT, 129 for SIGHUP."""
        return 128 + self.signum


NOTHING_SAVED = ("no RL step was in progress, nothing to save; the same command starts again "
                 "(from the newest checkpoint, if any)")
WARM_UP_NOT_SAVED = "the warm-up is not checkpointed: the same command runs it again"
FINISHED_FIRST = "the last checkpoint and the HF export were finished first; the run is complete"
AFTER_FINISH = "after the run finished"
EVERYTHING_SAVED = "everything is saved"
SECOND_SIGNAL = ("a second signal: the step in progress is not saved; the same command resumes "
                 "from the newest checkpoint")
BETWEEN_LOOPS = "after a loop of steps, before what follows it"
_early: dict = {"installed": False, "during": "start-up", "after": NOTHING_SAVED, "held": 0,
                "pending": None, "first_at": None, "late": None, "raised": None,
                "unraisable": sys.unraisablehook}


class Interrupted(KeyboardInterrupt):
    """A signal outside the RL steps: the run stops where it is, saving nothing; one line."""

    def __init__(self, signum: int, during: str, after: str):
        name = signal.Signals(signum).name
        when = during if during.startswith("after ") else f"during {during}"
        super().__init__(f"stopped by {name} {when}; {after}")
        self.signum = signum
        _early["first_at"] = _early["first_at"] or time.monotonic()  # a duplicate is ignored

    @property
    def exit_code(self) -> int:
        """128 + the signal: 143 for SIGTERM, 130 for SIGINT."""
        return 128 + self.signum

    def __str__(self) -> str:
        return str(self.args[0])


def set_phase(during: str, after: str = NOTHING_SAVED) -> None:
    """Name what the process is doing now, for the line of a signal that stops it here.
    Raises `Interrupted` if an earlier one was swallowed (`_raise`)."""
    _raise_swallowed()
    _early["during"], _early["after"] = during, after


def _raise(signum: int) -> None:
    """Raise `Interrupted` for `signum`, remembering it: raised from a signal handler, it can
    land in code that swallows it (a garbage-collection callback, a `__del__`: Python prints
    "Exception ignored in" and goes on), and is then raised again at the next phase."""
    _early["raised"] = signum
    raise Interrupted(signum, _early["during"], _early["after"])


def _raise_swallowed() -> None:
    """Raise again an `Interrupted` that was raised but never reached the entry point."""
    if _early["raised"] is not None:
        _raise(_early["raised"])


def _interrupt(signum: int, _frame) -> None:
    """The handler outside the RL steps: raise `Interrupted` now, or at the end of the
    `atomic()` section in progress; the same signal delivered twice is one stop, a later one
    ends the process at once (the default action)."""
    now = time.monotonic()
    first = _early["first_at"]
    if first is not None:
        if now - first < DUPLICATE_S:
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _early["first_at"] = now
    if _early["held"]:
        _early["pending"] = signum
        return
    _raise(signum)


def install() -> None:
    """Make SIGTERM, SIGINT and SIGHUP stop this process with one line wherever it is (call it
    at the entry point, in the main thread; `StopSignals` takes over during the RL steps)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in SIGNALS:
        signal.signal(s, _interrupt)
    if sys.unraisablehook is not _quiet_swallowed:
        _early["unraisable"] = sys.unraisablehook
        sys.unraisablehook = _quiet_swallowed
    _early.update(installed=True, first_at=None, pending=None, late=None, during="start-up",
                  after=NOTHING_SAVED, raised=None)


def _quiet_swallowed(unraisable) -> None:
    """sys.unraisablehook: an `Interrupted` raised where Python cannot propagate it (a
    garbage-collection callback: "Exception ignored in ...") prints nothing, as it is raised
    again at the next phase (`_raise_swallowed`); anything else is Python's to print."""
    if isinstance(unraisable.exc_value, Interrupted):
        return
    _early["unraisable"](unraisable)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """`install()` for a block (a driver called in process, as tests do); restores what was."""
    old = {s: signal.getsignal(s) for s in SIGNALS}
    was, hook = _early["installed"], sys.unraisablehook
    install()
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for s, handler in old.items():
                signal.signal(s, handler)
        sys.unraisablehook = hook
        _early.update(installed=was, raised=None)


def answers_signals() -> bool:
    """Whether this process stops on signals with its line (an entry point installed it; not
    a Ray actor, whose driver is the one that gets the signal)."""
    return _early["installed"]


@contextlib.contextmanager
def atomic() -> Iterator[None]:
    """A section a signal outside the RL steps never cuts short (a run-directory file being
    replaced, a checkpoint being committed): its `Interrupted` comes when it ends."""
    _early["held"] += 1
    try:
        yield
    finally:
        _early["held"] -= 1
    signum = _early["pending"]
    if signum is not None and not _early["held"]:
        _early["pending"] = None
        _raise(signum)


@contextlib.contextmanager
def final_export() -> Iterator[None]:
    """The export after the last step: a signal meanwhile waits for it (bounded, and a cut
    export is no export), then says the run is complete; from its end on, a signal says the
    run had already finished (`AFTER_FINISH`)."""
    set_phase("the final export", FINISHED_FIRST)
    with atomic():
        # A signal the RL loop had no step left to answer: answered here, as one during it.
        _early["pending"] = _early["pending"] or _early["late"]
        _early["late"] = None
        yield
    set_phase(AFTER_FINISH, EVERYTHING_SAVED)


class StopSignals:
    """Context manager: SIGTERM / SIGINT / SIGHUP set `signum` instead of ending the process.
    A signal that came just before (held by `atomic()`) is taken over on entry; one that came
    after the loop last read `signum` is handed on at exit (to the next `StopSignals`, else
    answered at the end of `final_export`), so no signal is dropped between the handlers."""

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
        self._restore()  # a second signal: stop at once, without the save
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)

    def __enter__(self) -> StopSignals:
        # The line if a second signal ends it; an early stop that was swallowed ends it here.
        set_phase("the RL steps", SECOND_SIGNAL)
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
            if _early["late"] is not None:
                self.signum, self._first_at = _early["late"], time.monotonic()
                _early["late"] = None
        return self

    def _restore(self) -> bool:
        """Put the handlers back; whether this context had installed them."""
        for s, handler in self._old.items():
            signal.signal(s, handler)
        had, self._old = bool(self._old), {}
        return had

    def __exit__(self, exc_type=None, *exc: object) -> None:
        if self._restore() and exc_type is None:
            set_phase(BETWEEN_LOOPS, NOTHING_SAVED)  # until the next phase: no step runs
            if self.signum is not None and _early["installed"]:
                _early["late"], _early["first_at"] = self.signum, self._first_at

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

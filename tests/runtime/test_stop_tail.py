"""No signal is dropped at the end of a run, in process: one that comes after the RL loop
last voted is handed on (to the next loop, else answered when the export ends), and one
after the export says the run had finished (the end-to-end runs: tests/e2e/test_signal_tail.py)."""

import os
import signal
import sys
import time

import pytest

from locojax.runtime.process.stop import (
    EVERYTHING_SAVED,
    FINISHED_FIRST,
    NOTHING_SAVED,
    Interrupted,
    StopSignals,
    atomic,
    final_export,
    installed,
    set_phase,
)


def test_a_signal_the_loop_did_not_read_is_answered_after_the_export():
    exported = []
    with installed():
        with StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGTERM)  # after the loop's last vote
        assert stop.signum == signal.SIGTERM and signal.getsignal(signal.SIGTERM) != \
            stop._handle
        with pytest.raises(Interrupted) as err:
            with final_export():
                time.sleep(0.1)
                exported.append("whole")  # the export runs to its end first
        assert exported == ["whole"] and err.value.exit_code == 143
        assert str(err.value) == f"stopped by SIGTERM during the final export; {FINISHED_FIRST}"


def test_a_signal_the_loop_did_not_read_goes_to_the_next_loop():
    """The warm-up's loop ends with a signal unread: the RL loop starts with it set (and
    stops, saved, at its first step boundary)."""
    with installed():
        with StopSignals():
            os.kill(os.getpid(), signal.SIGINT)
        with StopSignals() as rl:
            assert rl.signum == signal.SIGINT


def test_a_signal_after_the_export_says_the_run_had_finished():
    with installed():
        with final_export():
            pass
        with pytest.raises(Interrupted) as err:
            with atomic():  # the plot and the report finish first
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.1)
        assert str(err.value) == f"stopped by SIGTERM after the run finished; {EVERYTHING_SAVED}"
        assert err.value.exit_code == 143


def test_a_signal_answered_by_the_loop_is_not_handed_on():
    with installed():
        with pytest.raises(RuntimeError), StopSignals():
            os.kill(os.getpid(), signal.SIGTERM)
            raise RuntimeError("the loop stopped on it (Stopped, here any exception)")
        with final_export():
            pass  # no signal pending: the export ends normally


def test_a_signal_after_a_loop_ended_says_no_step_was_in_progress():
    """Between a loop's end and the export (the writer closing, the last progress line) no
    step is in progress: the line says so, not the loop's 'a second signal' line."""
    with installed():
        with StopSignals():
            pass
        with pytest.raises(Interrupted) as err:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
        assert str(err.value) == ("stopped by SIGTERM after a loop of steps, before what "
                                  f"follows it; {NOTHING_SAVED}")
        assert err.value.exit_code == 143


def test_an_interrupt_swallowed_where_it_landed_is_raised_at_the_next_phase(monkeypatch):
    """A signal's `Interrupted` that lands in code which swallows exceptions (a `__del__`,
    XLA's garbage-collection callback) is not handed to Python's "Exception ignored in"
    printer and is not lost: the next phase raises it, with the line of the phase the
    signal came in. Any other exception Python cannot raise is still handed on."""

    class SignalledWhileCollected:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs here, inside __del__
                pass

    class Broken:
        def __del__(self):
            raise ValueError("from __del__")

    handed_on = []
    monkeypatch.setattr(sys, "unraisablehook", handed_on.append)  # Python's printer
    with installed():
        set_phase("start-up")
        SignalledWhileCollected()  # collected at once: its Interrupted is ignored, quietly
        Broken()
        assert [type(u.exc_value) for u in handed_on] == [ValueError]
        with pytest.raises(Interrupted) as err:
            set_phase("the RL steps")
        assert err.value.exit_code == 143
        assert str(err.value) == f"stopped by SIGTERM during start-up; {NOTHING_SAVED}"
    set_phase("start-up")  # outside `installed()` nothing is left pending
    assert sys.unraisablehook == handed_on.append  # put back

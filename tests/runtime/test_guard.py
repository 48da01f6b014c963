"""The NaN guard and the stop on SIGTERM / SIGINT, in process: the step's own finiteness
metric, the trainer refusing a non-finite step (its state never saved, the last good
checkpoint kept), the signal flag and the hosts' agreement on it, and the door's lines and
exit codes (the end-to-end stop and resume is in tests/e2e/test_user_errors.py)."""

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from test_door import _exit, _raise
from test_trainer import _host, _rows

from locojax.launch.local import _stop_all
from locojax.runtime.errors import NonFinite
from locojax.runtime.guard import non_finite, stop_line
from locojax.runtime.process.stop import (
    DUPLICATE_S,
    FINISHED_FIRST,
    NOTHING_SAVED,
    WARM_UP_NOT_SAVED,
    Interrupted,
    Stopped,
    StopSignals,
    agreed_signal,
    atomic,
    installed,
    set_phase,
)
from locojax.runtime.trainer import Trainer
from locojax.train.step import PARAMS_FINITE, params_finite


@pytest.mark.parametrize("metrics,what", [
    ({"loss": float("nan"), "grad_norm": float("inf")}, "loss is nan"),
    ({"loss": 0.1, "grad_norm": float("inf")}, "grad_norm is inf"),
    ({"loss": 0.1, "grad_norm": 1.0, PARAMS_FINITE: 0.0}, "the updated parameters hold nan"),
    ({"loss": 0.1, "grad_norm": 1.0, PARAMS_FINITE: 1.0}, None),
])
def test_the_first_non_finite_metric_is_named(metrics, what):
    got = non_finite(metrics)
    assert got == what if what is None else got.startswith(what)


def test_params_finite_is_one_reduction_over_sharded_leaves():
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    w = jax.device_put(jnp.ones((4, 6)), NamedSharding(mesh, P("data")))
    tree = {"w": w, "b": jnp.zeros(3), "count": jnp.array(7, jnp.int32)}
    check = jax.jit(params_finite)
    assert float(check(tree)) == 1.0
    for bad in (jnp.nan, jnp.inf, -jnp.inf):
        assert float(check({**tree, "w": w.at[3, 5].set(bad)})) == 0.0


def test_a_non_finite_step_is_never_saved_and_the_last_good_one_kept(tmp_path):
    host = _host("run.steps=3", "run.checkpoint_every=1", "algorithm.sft_warmup_steps=0")
    trainer = Trainer(host, tmp_path, host.prompt_range(), primary=True)
    trainer.start(log=lambda _: None)
    metrics = trainer.train(0, _rows(host))
    assert metrics[PARAMS_FINITE] == 1.0 and np.isfinite(metrics["grad_norm"])
    bad = _rows(host)
    bad["advantages_B"][0] = np.nan  # one poisoned row: the data problem the line points to
    with pytest.raises(NonFinite) as err:
        trainer.train(1, bad)
    ckpt = tmp_path / "checkpoints"
    assert str(err.value).startswith(f"step 2: loss is nan; the last good checkpoint is step 1 "
                                     f"({ckpt.absolute() / '1'}); nothing exported")
    assert trainer.checkpoints.all_steps() == [1]
    trainer.checkpoints.close()


def test_the_line_without_a_checkpoint():
    line = stop_line(3, "grad_norm is nan", None, Path("/r/checkpoints"), "supervised warm-up step")
    assert line.startswith("supervised warm-up step 3: grad_norm is nan; no checkpoint was saved "
                           "yet; nothing exported")


def test_a_signal_sets_the_flag_and_a_second_ctrl_c_stops_at_once():
    before = signal.getsignal(signal.SIGINT)
    with StopSignals() as stop:
        assert stop.flag == 0.0
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM and stop.flag == float(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGINT
        time.sleep(DUPLICATE_S + 0.1)  # sooner is the same stop delivered twice (below)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("flags,want", [([0.0, 0.0], None), ([0.0, 15.0], signal.SIGTERM),
                                        ([2.0, 0.0, 0.0], signal.SIGINT),
                                        ([2.0, 15.0], signal.SIGTERM)])
def test_every_host_agrees_on_the_signal_from_the_gathered_flags(flags, want):
    assert agreed_signal(flags) == want


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_the_door_prints_the_stop_line_and_exits_128_plus_the_signal(signum, code, capsys):
    stop = Stopped(signum, 4, Path("/r/checkpoints/4"))
    assert _exit(_raise(stop)) == code
    name = signal.Signals(signum).name
    assert capsys.readouterr().err == (f"stopped by {name} after step 4; checkpoint saved: "
                                       "/r/checkpoints/4; resume with the same command\n")


def test_a_diverged_run_is_one_line_and_exit_1_also_from_a_ray_task(capsys):
    err = NonFinite("step 7: grad_norm is nan; the last good checkpoint is step 5 (/r/5)")
    assert _exit(_raise(err)) == 1
    assert capsys.readouterr().err == f"error: {err}\n"

    class RayTaskError(Exception):
        def __init__(self, cause):
            super().__init__("ray: the task failed\n  many lines")
            self.cause = cause
    assert _exit(_raise(RayTaskError(err))) == 1
    assert capsys.readouterr().err == f"error: {err}\n"


def test_a_second_signal_to_the_launcher_kills_hosts_that_are_still_saving():
    saving = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "print('up', flush=True); time.sleep(60)")
    host = subprocess.Popen([sys.executable, "-c", saving], stdout=subprocess.PIPE,
                            start_new_session=True)
    assert host.stdout.readline() == b"up\n"
    now = threading.Event()
    threading.Timer(0.5, now.set).start()
    began = time.monotonic()
    _stop_all([host], wait_s=60, now=now)
    # Killed on the second signal, not after the 60 s wait (the bound tells the two apart).
    assert host.returncode == -signal.SIGKILL and time.monotonic() - began < 40



def test_a_signal_delivered_twice_is_one_stop():
    """A process group's SIGTERM reaches a joined host directly and through its supervisor
    (locojax.launch.fatal passes signals on): the two arrive within DUPLICATE_S and are one
    stop, so the step is still saved."""
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # no default action: the process lives on
        assert stop.signum == signal.SIGTERM


def test_a_signal_before_the_steps_is_one_line_and_128_plus_the_signal(capsys):
    """Start-up (composition, compilation, restore): nothing to save, the process unwinds at
    once (every `finally` runs) and the door says where it stopped."""
    with installed():
        with pytest.raises(Interrupted) as err:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises at the next bytecode, well before this ends
        assert err.value.exit_code == 143 and isinstance(err.value, KeyboardInterrupt)
        assert str(err.value) == f"stopped by SIGTERM during start-up; {NOTHING_SAVED}"
        assert _exit(_raise(err.value)) == 143
        assert capsys.readouterr().err == f"{err.value}\n"
        os.kill(os.getpid(), signal.SIGTERM)  # the same stop delivered twice: ignored
    with installed():  # installed anew: a new stop
        set_phase("the final export", FINISHED_FIRST)
        with pytest.raises(Interrupted) as err:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        assert err.value.exit_code == 130
        assert str(err.value).startswith("stopped by SIGINT during the final export; the last")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_an_atomic_section_finishes_before_the_signal_is_answered(tmp_path):
    written = tmp_path / "plan.json"
    with installed(), pytest.raises(Interrupted):
        with atomic():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the signal came: the section still runs to its end
            written.write_text("whole")
        raise AssertionError("the signal is answered when the section ends")
    assert written.read_text() == "whole"


def test_a_signal_in_the_warm_up_stops_it_at_a_step_boundary_unsaved(tmp_path):
    host = _host("run.steps=2", "algorithm.sft_warmup_steps=3")
    trainer = Trainer(host, tmp_path, host.prompt_range(), primary=True)
    sft, calls = trainer.steps.sft, []

    def first_step_then_sigterm(*args):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives inside the step: voted after it
        return sft(*args)

    trainer.steps = dataclasses.replace(trainer.steps, sft=first_step_then_sigterm)
    with installed(), pytest.raises(Interrupted) as err:
        trainer.start(log=lambda _: None)
    assert len(calls) == 1 and err.value.exit_code == 143
    assert str(err.value) == ("stopped by SIGTERM during the supervised warm-up (after step 1 "
                              f"of 3); {WARM_UP_NOT_SAVED}")
    assert trainer.checkpoints.all_steps() == []
    trainer.checkpoints.close()


def test_the_launcher_passes_on_the_signal_it_got():
    """Ctrl-C of the local launcher reaches its hosts as SIGINT (their line names it)."""
    host = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                             "signal.signal(signal.SIGINT, lambda s, f: sys.exit(s))\n"
                             "print('up', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, start_new_session=True)
    assert host.stdout.readline() == b"up\n"
    _stop_all([host], wait_s=30, sig=signal.SIGINT)
    assert host.returncode == signal.SIGINT

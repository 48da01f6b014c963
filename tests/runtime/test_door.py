"""The one door: user errors become one line and exit 2, Ctrl-C 130, a bug keeps its
traceback; Hydra's composition errors become one line naming the key (and the options)."""

import errno
import subprocess
import sys

import pytest
from paths import ROOT

from compiler import PlanError
from locojax.config.compose import compose_config
from locojax.data import DataError
from locojax.launch import door
from locojax.model import CheckpointError
from locojax.runtime.errors import UserError

MODELS = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
"""The model group's options, as Hydra's refusal lists them (sorted; the first 12 shown)."""


def _exit(fn) -> int:
    with pytest.raises(SystemExit) as out:
        door.door(fn)
    return out.value.code


def _raise(err):
    def fn():
        raise err
    return fn


@pytest.mark.parametrize("err", [
    PlanError("run.steps", -1, "must be >= 1", "bound"), UserError("model.checkpoint=/x: no"),
    DataError("gsm8k: no file /x/train.jsonl"), CheckpointError("/x/config.json: not JSON")])
def test_user_errors_are_one_line_and_exit_2(err, capsys):
    assert _exit(_raise(err)) == 2
    err_text = capsys.readouterr().err
    assert err_text == f"error: {err}\n"


def test_ctrl_c_is_one_line_and_exit_130(capsys):
    assert _exit(_raise(KeyboardInterrupt())) == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C)\n"


def test_a_bug_keeps_its_traceback():
    with pytest.raises(ZeroDivisionError):
        door.door(lambda: 1 / 0)


def test_a_user_error_inside_a_ray_task_error_is_unwrapped():
    class RayTaskError(Exception):
        def __init__(self, cause):
            super().__init__("ray: the task failed\n  many lines")
            self.cause = cause
    line = door.user_error_line(RayTaskError(DataError("gsm8k: no usable rows")))
    assert line == "gsm8k: no usable rows"


def test_a_full_disk_names_the_file():
    full = OSError(errno.ENOSPC, "No space left on device", "/r/checkpoints/4/x")
    wrapped = RuntimeError("async save failed")
    wrapped.__cause__ = full
    assert door.user_error_line(wrapped).startswith("/r/checkpoints/4/x: no space left")


def _hydra_line(*overrides):
    try:
        compose_config(list(overrides))
    except Exception as err:
        return door.user_error_line(err)
    raise AssertionError(f"{overrides} composed")


@pytest.mark.parametrize("overrides,line", [
    (["foo=1"], "foo: no such key in the config: model, workload, mesh, hardware, placement, "
                "controller, algorithm, sampling, run"),
    (["+foo=1"], "foo: no such key in the config: model, workload, mesh, hardware, placement, "
                 "controller, algorithm, sampling, run"),
    (["+run.foo=1"], "run.foo: no such key in run: steps, seed, checkpoint_every, eval_every, "
                     "plan_only, eval_samples, loggers, wandb, mlflow, reuse_dir"),
    (["run.stepz=5"], "run.stepz: no such key in run: steps, seed, checkpoint_every, "
                      "eval_every, plan_only, eval_samples, loggers, wandb, mlflow, reuse_dir"),
    (["run.steps=abc"], "run.steps=abc: Value 'abc' of type 'str' could not be converted to "
                        "Integer"),
    (["algorithm.loss_aggregation=bogus"], "algorithm.loss_aggregation=bogus: Invalid value "
     "'bogus', expected one of [sequence_mean, token_mean, constant]"),
    (["model=nope"], f"model=nope: no such option ({len(MODELS)} of them, e.g. "
                     f"{', '.join(MODELS[:12])})"),
])
def test_hydra_errors_are_one_line_naming_the_key(overrides, line):
    assert _hydra_line(*overrides) == line


def test_an_override_that_does_not_parse_is_named(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["locojax", "run.steps=2", "x=["])
    assert _hydra_line("x=[").startswith("x=[: cannot parse it (")


def test_a_user_error_in_a_ray_actors_text_is_found():
    import ray.exceptions

    text = ("The actor died because of an error raised in its creation task, ray::A.__init__()\n"
            '  File "x.py", line 1, in f\nlocojax.runtime.errors.UserError: model.checkpoint=/x: '
            "no config.json in that directory")
    err = ray.exceptions.RayError(text)
    assert door.user_error_line(err) == "model.checkpoint=/x: no config.json in that directory"
    assert door.user_error_line(ray.exceptions.RayError("ZeroDivisionError: division")) is None


def test_a_diverged_run_in_a_ray_actors_text_is_found():
    import ray.exceptions

    text = ('  File "trainer.py", line 9, in train\nlocojax.runtime.errors.NonFinite: step 3: loss '
            "is nan; the last good checkpoint is step 2 (/r/2)")
    line = door.run_failure_line(ray.exceptions.RayError(text))
    assert line == "step 3: loss is nan; the last good checkpoint is step 2 (/r/2)"
    assert door.user_error_line(ray.exceptions.RayError(text)) is None


def test_a_refused_command_line_never_loads_jax(tmp_path):
    """A configuration refusal is one line, exit 2, before any model code: JAX is not
    loaded (the door names the model package's error type only once the package is)."""
    probe = ("import atexit, runpy, sys\n"
             "atexit.register(lambda: print('jax loaded:', 'jax' in sys.modules,\n"
             "                              file=sys.stderr))\n"
             "runpy.run_module('locojax', run_name='__main__', alter_sys=True)\n")
    out = subprocess.run([sys.executable, "-c", probe, "+experiment=arith_co",
                          "workload.tools.x=calc.py:add", f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.splitlines() == ["error: workload.tools.x: no such key in workload.tools",
                                       "jax loaded: False"]

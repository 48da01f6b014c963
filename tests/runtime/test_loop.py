"""The one step loop (`runtime.loop`) with modes of both shapes: one that returns each step as
it trains it (CO, the single controller) and one whose row waits for the next step (DA); the
stop on a signal, the evaluation cadence, the rows and the export in one place."""

import json
import os
import signal
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from compiler import compile_plan
from locojax.config.compose import compose_config
from locojax.runtime.loop import Begun, StepDone, run_loop
from locojax.runtime.observe.stats import HostStats
from locojax.runtime.process.stop import Stopped

PLAN = compile_plan(compose_config(["+experiment=arith_co", "run.steps=5", "run.eval_every=2",
                                    "run.loggers=[jsonl]"]))


def _stats(reward: float) -> np.ndarray:
    values = {f.name: 1.0 for f in fields(HostStats) if f.name != "fn_stats"}
    values |= {"reward_sum": reward * 4, "samples": 4.0, "reward_sq_sum": reward * reward * 4}
    return HostStats(**values).as_array()[None]


class Steps:
    """A mode that trains nothing: each step's reward is step / 10; `lag`: rows wait one step
    (DA's shape); `signal_at`: `sig` to this process during that step."""

    def __init__(self, start: int = 0, lag: bool = False, signal_at: int | None = None,
                 sig: signal.Signals = signal.SIGTERM):
        self.progress_keys = {"lag": "policy_lag_max"} if lag else {}
        self.start, self.lag, self.signal_at, self.sig = start, lag, signal_at, sig
        self.ran, self.saved, self.evaluated, self.finished = [], [], [], False
        self.pending: StepDone | None = None

    def begin(self, log) -> Begun:
        log(f"begun at {self.start}")
        return Begun(self.start, None)

    def step(self, step: int, stop, emit):
        self.ran.append(step)
        if step == self.signal_at:
            os.kill(os.getpid(), self.sig)
        done = StepDone(step, time.time(), _stats(step / 10), {"loss": 0.5, "params_finite": 1},
                        {"rollout_s": 0.0, "reward_s": 0.0, "advantage_s": 0.0, "train_s": 0.0,
                         "transfer_s": 0.0, "policy_lag_max": 1}, pending=f"eval {step}")
        if self.lag:
            if self.pending:
                emit(self.pending)
            self.pending = done
        else:
            emit(done)
        return int(stop.flag) or None

    def evaluate(self, done: StepDone) -> dict:
        self.evaluated.append(done.pending)
        return {"eval_greedy_accuracy": 0.25}

    def drain(self):
        done, self.pending = self.pending, None
        return [done] if done else []

    def vote(self, flag: float):
        return int(flag) or None

    def save_now(self, done: int) -> Path:
        self.saved.append(done)
        return Path(f"/r/checkpoints/{done}")

    def finish(self):
        self.finished = True
        return Path("/r/hf")


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("lag", [False, True], ids=["each-step", "row-waits-a-step"])
def test_every_step_has_its_row_and_evaluation_and_the_run_exports(tmp_path, lag):
    mode, said = Steps(lag=lag), []
    summary = run_loop(mode, PLAN, tmp_path, log=said.append)
    assert said == ["begun at 0"] and mode.ran == [0, 1, 2, 3, 4] and mode.finished
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["reward_mean"] for r in rows] == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    # every 2 steps and the last, each with the step's own evaluation
    assert [r["step"] for r in rows if "eval_greedy_accuracy" in r] == [1, 3, 4]
    assert mode.evaluated == ["eval 1", "eval 3", "eval 4"]
    assert all(r["eval_s"] >= 0 for r in rows if "eval_greedy_accuracy" in r)
    assert "params_finite" not in rows[0] and rows[0]["loss"] == 0.5
    assert summary.steps == 5 and summary.export == Path("/r/hf") and mode.saved == []
    assert summary.first_reward == 0.0 and summary.last_reward == pytest.approx(0.2)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("lag", [False, True], ids=["each-step", "row-waits-a-step"])
def test_a_signal_finishes_the_step_writes_its_row_saves_it_and_stops(tmp_path, lag, sig):
    before = signal.getsignal(sig)
    mode = Steps(lag=lag, signal_at=1, sig=sig)
    with pytest.raises(Stopped) as err:
        run_loop(mode, PLAN, tmp_path)
    assert mode.ran == [0, 1] and mode.saved == [2] and not mode.finished
    assert [r["step"] for r in _rows(tmp_path)] == [0, 1]  # the pending row written first
    assert err.value.exit_code == 128 + sig  # 143, 129
    assert str(err.value) == (f"stopped by {sig.name} after step 2; checkpoint saved: "
                              "/r/checkpoints/2; resume with the same command")
    assert signal.getsignal(sig) is before
    # The same command resumes at the saved step; rows from there replace what followed.
    again = Steps(start=2, lag=lag)
    summary = run_loop(again, PLAN, tmp_path)
    assert again.ran == [2, 3, 4] and summary.steps == 3
    assert [r["step"] for r in _rows(tmp_path)] == [0, 1, 2, 3, 4]


def test_a_signal_during_the_last_row_saves_and_skips_the_export(tmp_path):
    mode = Steps(signal_at=4)
    with pytest.raises(Stopped) as err:
        run_loop(mode, PLAN, tmp_path)
    assert mode.saved == [5] and not mode.finished and "after step 5" in str(err.value)


def test_a_first_step_that_cut_its_prompts_says_so_once(tmp_path, caplog):
    """Every step's row has 1 of 1 prompts cut (`_stats`): one warning line, after the first
    step, naming the key (issue 60, item 2)."""
    with caplog.at_level("WARNING"):
        run_loop(Steps(), PLAN, tmp_path)
    lines = [r.getMessage() for r in caplog.records if "max_prompt_len" in r.getMessage()]
    assert len(lines) == 1 and "1 of 1 prompts" in lines[0]

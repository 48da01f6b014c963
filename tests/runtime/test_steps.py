"""The step kit every mode calls (`locojax.runtime.steps`): the problems of a step, the
evaluation share, the metrics row, the summary and its report."""

import numpy as np
import pytest

from locojax.data import Problem, PromptStream, Workload
from locojax.data.stream import DataPosition
from locojax.runtime.observe.stats import STAT_KEYS
from locojax.runtime.steps import (
    FINAL_WINDOW,
    PHASE_KEYS,
    TRAIN_INTERNALS,
    eval_due,
    eval_problems,
    metrics_row,
    report,
    step_problems,
    summarize,
    train_fields,
)


def _workload(n_train=12, n_eval=5) -> Workload:
    def make(split, n):
        return [Problem(uid=f"t/{split}/{i}", question=f"q{i}", answer=str(i)) for i in range(n)]
    return Workload(name="t", train=make("train", n_train), eval=make("eval", n_eval), skipped=0)


def test_the_hosts_ranges_of_a_step_concatenate_to_the_steps_problems():
    w = _workload()
    stream = PromptStream(len(w.train), 6, DataPosition(seed=3))
    whole = step_problems(w, stream, 2, (0, 6))
    parts = step_problems(w, stream, 2, (0, 2)) + step_problems(w, stream, 2, (2, 6))
    assert [p.uid for p in parts] == [p.uid for p in whole] and len(whole) == 6
    assert [p.uid for p in whole] != [p.uid for p in step_problems(w, stream, 3, (0, 6))]


@pytest.mark.parametrize("shares", [1, 2, 3, 7])
def test_evaluation_shares_cover_the_first_eval_prompts_once(shares):
    w = _workload(n_eval=5)
    got = [p.uid for i in range(shares) for p in eval_problems(w, 4, i, shares)]
    assert got == [f"t/eval/{i}" for i in range(4)]
    assert len(eval_problems(w, 99, 0, 1)) == 5  # no more than the held-out split holds


def test_evaluation_is_due_every_n_steps_and_after_the_last():
    assert [s for s in range(10) if eval_due(s, 10, 4)] == [3, 7, 9]
    assert not any(eval_due(s, 10, 0) for s in range(10))


def test_the_row_separates_evaluation_from_host_other_time():
    stats = np.zeros((2, len(STAT_KEYS)))
    stats[:, STAT_KEYS.index("samples")] = 4
    stats[:, STAT_KEYS.index("tokens")] = 10
    stats[:, STAT_KEYS.index("rollout_s")] = [1.0, 2.0]
    times = {"train_s": 3.0, "transfer_s": 0.5, "step_s": 10.0}
    plain = metrics_row(0, stats, {"loss": 1.5, "other": 9.0}, times)
    assert plain["host_other_s"] == pytest.approx(10.0 - 2.0 - 3.0 - 0.5)
    assert plain["tokens_per_s"] == pytest.approx(2.0)
    assert "kl" not in plain  # not measured (no reference): absent, not 0
    assert plain["other"] == 9.0 and plain["loss"] == 1.5  # every scalar the step returned
    with_eval = metrics_row(0, stats, {}, times | {"eval_s": 4.0, "eval_greedy_accuracy": 0.5})
    assert with_eval["host_other_s"] == pytest.approx(0.5) and with_eval["eval_s"] == 4.0
    assert set(PHASE_KEYS) <= set(plain)


def test_train_fields_write_every_scalar_but_the_runtimes_own():
    """No allow-list: a metric the loss adds (dual_clip_frac, pg_loss, advantage_mean) is a
    column without touching this module; the NaN guard's and the token count are not."""
    metrics = {"loss": 1, "kl": 0.25, "ratio_max": 2, "dual_clip_frac": np.float32(0.5),
               "pg_loss": 0.125, "advantage_mean": 0.0, "params_finite": True,
               "response_tokens": 96.0, "per_row": np.zeros(3)}
    assert train_fields(metrics) == {"kl": 0.25, "loss": 1.0, "ratio_max": 2.0,
                                     "dual_clip_frac": 0.5, "pg_loss": 0.125,
                                     "advantage_mean": 0.0}
    assert set(TRAIN_INTERNALS) == {"params_finite", "response_tokens"}


def test_summary_averages_the_last_window_and_a_complete_run_says_so(capsys, tmp_path):
    rewards = [0.0] * 5 + [1.0] * FINAL_WINDOW
    s = summarize(rewards, {"accuracy": 0.75}, start=0, total_steps=15, seconds=2.0)
    assert (s.first_reward, s.last_reward, s.last_accuracy, s.steps) == (0.0, 1.0, 0.75, 15)
    report(s, tmp_path)
    assert "steps run" in capsys.readouterr().err
    done = summarize([], {}, start=15, total_steps=15, seconds=0.1, export=tmp_path / "hf")
    report(done, tmp_path)
    err = capsys.readouterr().err
    assert err.startswith("already complete at step 15") and "nan" not in err
    assert len(err.strip().splitlines()) == 1
    # It got this far (dispatch's check found no whole export of step 15): it exported.
    assert "its HF export was missing or older: written again; metrics" in err


def test_a_multi_turn_summary_says_how_the_episodes_went(capsys, tmp_path):
    row = {"accuracy": 0.5, "turns_mean": 2.375, "turns_max": 4, "tool_calls": 12,
           "tool_errors": 1, "env_errors": 0, "truncated_frac": 0.125, "device_idle_frac": 0.08}
    s = summarize([0.5], row, start=0, total_steps=1, seconds=1.0)
    assert s.episodes == ("turns 2.4 mean, 4 max; 12 tool calls (1 failed); 0 env errors; "
                          "12% truncated; devices idle 8% of the rollout")
    report(s, tmp_path)
    assert "episodes (last step)" in capsys.readouterr().err
    assert summarize([0.5], {"accuracy": 0.5}, 0, 1, 1.0).episodes is None  # one reply each

"""Issue 60, items 7 and 9: what an episode that an environment failure ended, or a limit cut,
trains on, in both schedules (`run_episodes`, `run_refilled`: the host step every mode runs):
`algorithm.mask_env_failures` clears such an episode's loss mask and counts it;
`algorithm.overlong` keeps, masks or penalises (DAPO's soft overlong punishment) a cut one."""

import dataclasses

import numpy as np
import pytest
from test_turns import _limits, _rows, _scripted, _scripted_slots

from compiler.vocab import Overlong
from locojax.envs.runner import EnvRunner, EnvSpec
from locojax.runtime.hostwork import TurnCounts
from locojax.runtime.observe.stats import turn_fields
from locojax.runtime.turns import TurnFormat, overlong_penalty, run_episodes, run_refilled
from locojax.tokenizers.qwen import load_qwen3

FLAKY = '''
class Flaky:
    """Echo's answers; row "fail" raises in its first step (an environment failure)."""

    def __init__(self, row):
        self.fail = bool(row.get("fail"))

    def step(self, reply):
        if self.fail:
            raise RuntimeError("the environment's server went away")
        if "stop" in reply:
            return [], 1.0, True
        return [{"role": "user", "content": "again"}], 0.5, False
'''
SCRIPT = [["go", "stop"], ["go", "stop"], ["go", "go", "go"]]
"""Episode 0 ends done, episode 1's environment fails, episode 2 is cut by max_turns."""
FMT = TurnFormat(load_qwen3(), chat=True, thinking=False)


@pytest.fixture(scope="module")
def flaky(tmp_path_factory):
    path = tmp_path_factory.mktemp("env") / "flaky.py"
    path.write_text(FLAKY)
    r = EnvRunner(EnvSpec(env=f"{path}:Flaky", tools=(), step_timeout_s=5, tool_timeout_s=5,
                          workers=1))
    r.check()
    yield r
    r.close()


def _run(runner, refill: bool, **limits):
    rows = [dict(r, fail=i == 1) for i, r in enumerate(_rows(3))]
    lim = dataclasses.replace(_limits(), **limits)
    if refill:
        return run_refilled(rows, runner, FMT, lim, _scripted_slots(SCRIPT, [1, 2, 1]),
                            group=3, counts=[3], slots=2)
    return run_episodes(rows, runner, FMT, lim, _scripted(SCRIPT), group=3)


@pytest.mark.parametrize("refill", [False, True], ids=["static", "refill"])
def test_an_episode_an_environment_failure_ended_gets_no_loss_weight(flaky, refill):
    kept = _run(flaky, refill, mask_failures=False)
    assert kept.env_errors == 1 and kept.completions.mask_BxT[1].any()
    assert kept.masked_failures == 0
    eps = _run(flaky, refill)
    mask = eps.completions.mask_BxT
    assert not mask[1].any() and mask[0].any() and mask[2].any()
    np.testing.assert_array_equal(mask[[0, 2]], kept.completions.mask_BxT[[0, 2]])
    assert eps.masked_failures == 1 and eps.masked_overlong == 0
    total = {**vars(TurnCounts.of(eps)), "tokens": 0.0, "rollout_s": 1.0}
    per_host = {k: np.array([v]) for k, v in total.items()}
    row = turn_fields(total, per_host)
    assert row["masked_env_failures"] == 1 and row["masked_overlong"] == 0


@pytest.mark.parametrize("refill", [False, True], ids=["static", "refill"])
def test_overlong_keeps_masks_or_penalises_a_cut_episode(flaky, refill):
    keep = _run(flaky, refill)
    assert keep.truncated_B.tolist() == [False, False, True] and keep.penalty_B is None
    assert keep.completions.mask_BxT[2].any()
    masked = _run(flaky, refill, overlong=Overlong.mask)
    assert not masked.completions.mask_BxT[2].any() and masked.completions.mask_BxT[0].any()
    assert masked.masked_overlong == 1 and masked.masked_failures == 1
    penalised = _run(flaky, refill, overlong=Overlong.penalty, overlong_buffer=16)
    assert penalised.completions.mask_BxT[2].any()
    lengths = penalised.completions.lengths_B.tolist()
    want = [overlong_penalty(n, 64, 16, cut) for n, cut in zip(lengths, [False, False, True],
                                                                 strict=True)]
    assert want[2] == -1.0
    np.testing.assert_allclose(penalised.penalty_B, want)


def test_dapo_soft_overlong_punishment_by_hand():
    """Yu et al. 2025, eq. 13 with L_max = 20, L_cache = 4: 0 up to 16 tokens, then
    (16 - |y|) / 4, and -1 past 20 (or cut)."""
    assert [overlong_penalty(n, 20, 4, False) for n in (10, 16, 17, 18, 20, 21)] == [
        0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert overlong_penalty(5, 20, 4, True) == -1.0
    assert overlong_penalty(20, 20, 0, False) == 0.0

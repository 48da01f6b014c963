"""Issue 60, item 8: a per-group environment seed, `row["seed"]`, from (run.seed, step, the
problem's uid): a group's episodes face the same draws, and a step run again (a resumed run)
replays them."""

import numpy as np
import pytest
from test_turns import _limits, _scripted

from locojax.data import Problem
from locojax.envs.runner import EnvRunner, EnvSpec
from locojax.runtime.turns import EVAL_STEP, TurnFormat, env_seed, episode_rows, run_episodes
from locojax.tokenizers.qwen import load_qwen3

DICE = '''
import random

class Dice:
    """Each step answers with a number drawn from random.Random(row["seed"])."""

    def __init__(self, row):
        self.rng = random.Random(row["seed"])

    def step(self, reply):
        return [{"role": "user", "content": str(self.rng.randrange(10**6))}], 0.0, False
'''
PROBLEMS = [Problem(uid=f"p{i}", question=f"Roll {i}.", answer="1") for i in range(2)]


@pytest.fixture(scope="module")
def dice(tmp_path_factory):
    path = tmp_path_factory.mktemp("env") / "dice.py"
    path.write_text(DICE)
    r = EnvRunner(EnvSpec(env=f"{path}:Dice", tools=(), step_timeout_s=5, tool_timeout_s=5,
                          workers=2))
    r.check()
    yield r
    r.close()


def test_a_groups_rows_share_one_seed_of_run_seed_step_and_uid():
    rows = episode_rows(PROBLEMS, 3, "{question}", run_seed=7, step=4)
    seeds = [r["seed"] for r in rows]
    assert seeds[:3] == [env_seed(7, 4, "p0")] * 3 and seeds[3:] == [env_seed(7, 4, "p1")] * 3
    assert len({env_seed(7, 4, "p0"), env_seed(7, 5, "p0"), env_seed(8, 4, "p0"),
                env_seed(7, 4, "p1"), env_seed(7, EVAL_STEP, "p0")}) == 5
    assert all(0 <= s < 2**63 for s in seeds)
    assert episode_rows(PROBLEMS, 3, "{question}", 7, 4) == rows  # a resumed step: the same


def _transcripts(runner, step: int) -> list[str]:
    rows = episode_rows(PROBLEMS, 2, "{question}", run_seed=0, step=step)
    fmt = TurnFormat(load_qwen3(), chat=True, thinking=False)
    eps = run_episodes(rows, runner, fmt, _limits(turns=3), _scripted([["go"]] * 4), group=2)
    return [" ".join(m["content"] for m in msgs if m["role"] == "user") for msgs in eps.messages]


def test_a_groups_episodes_face_the_same_draws_and_a_step_replays_them(dice):
    """Two workers (the group's episodes on different ones): each group's two episodes read
    the same numbers, the two groups different ones, and the step run again the same."""
    got = _transcripts(dice, step=3)
    assert got[0] == got[1] and got[2] == got[3] and got[0] != got[2]
    assert _transcripts(dice, step=3) == got
    assert _transcripts(dice, step=4) != got
    assert np.unique(got).size == 2

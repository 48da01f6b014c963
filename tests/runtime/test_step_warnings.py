"""Issue 62, item 7: one warning line per step for each kind of the user's code that failed
(the environment, its tools, each reward function), with the count and the first failure,
whatever the schedule: an environment raising on its second turn gave a line per episode
under `sampling.schedule=refill` (135 lines over 2 steps). The lines come from
`hostwork.say_failures`, which every mode calls once at the end of each step."""

import logging
from types import SimpleNamespace

import numpy as np
import pytest

from locojax.envs.runner import EnvRunner, EnvSpec
from locojax.rewards.tally import Tally
from locojax.runtime.hostwork import say_failures
from locojax.runtime.turns import TurnFormat, TurnLimits, run_episodes, run_refilled, waves_of
from locojax.tokenizers.char import load_char

ENV = '''
class RaisesOnTwo:
    def __init__(self, row):
        self.turn = 0

    def step(self, reply):
        self.turn += 1
        if self.turn == 2:
            raise RuntimeError("boom on turn 2")
        return [{"role": "user", "content": "again"}], 0.0, False
'''
TOK = load_char("ascii")
LIMITS = TurnLimits(prompt=32, episode=200, reply=4, turns=4, stop_ids=(TOK.eos_id,),
                    pad_id=TOK.pad_id)
EPISODES = 12


def _reply() -> tuple:
    ids = np.array([*TOK.encode("go"), TOK.eos_id])
    return ids, np.zeros(len(ids), np.float32), np.zeros(len(ids), np.float32)


def _advance(feeds, running):
    """Every fed or running slot's reply ends in this call."""
    return {slot: _reply() for slot in set(feeds) | set(running)}


def _generate(prompts, turn, wave):
    from locojax.runtime.hostwork import Completions
    b, w = prompts.ids_BxP.shape
    ids, _, _ = _reply()
    tokens = np.concatenate([prompts.ids_BxP, np.tile(ids, (b, 1))], axis=1).astype(np.int32)
    zeros = np.zeros((b, len(ids)), np.float32)
    return Completions(tokens, np.ones((b, len(ids)), bool), zeros, zeros,
                       np.full(b, len(ids), np.int32), prompts.len_B)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    path = tmp_path_factory.mktemp("env") / "raises.py"
    path.write_text(ENV)
    r = EnvRunner(EnvSpec(env=f"{path}:RaisesOnTwo", tools=(), step_timeout_s=5,
                          tool_timeout_s=5, workers=2))
    r.check()
    yield r
    r.close()


@pytest.mark.parametrize("schedule", ["refill", "static", "static, two waves in flight"])
def test_an_env_failing_in_every_episode_is_one_line_a_step(runner, caplog, schedule):
    rows = [{"prompt": "2+3?"} for _ in range(EPISODES)]
    fmt = TurnFormat(TOK, chat=False, thinking=False)
    scorer = SimpleNamespace(fns=SimpleNamespace(tallies={}))
    with caplog.at_level(logging.WARNING):
        for step in (1, 2):
            if schedule == "refill":
                eps = run_refilled(rows, runner, fmt, LIMITS, _advance, group=4,
                                   counts=[EPISODES], slots=3)
            else:
                eps = run_episodes(rows, runner, fmt, LIMITS, _generate, group=4,
                                   waves=waves_of([EPISODES], 4),
                                   in_flight=1 if schedule == "static" else 2)
            # tallied, not told: the lines so far are the earlier steps' own
            assert eps.env_errors == EPISODES and len(caplog.records) == step - 1
            say_failures(f"step {step}", scorer, runner.tallies)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    for step, line in zip((1, 2), lines, strict=True):
        assert line.startswith(f"step {step}: environment ") and "RaisesOnTwo failed in 12 " \
            "episode turn(s); first: episode " in line and "boom on turn 2" in line


def test_each_kind_is_its_own_line_and_a_clean_step_is_silent(caplog):
    env, tools, reward = Tally("environment e.py:E", "episode turn(s)"), \
        Tally("the tools", "episode turn(s)"), Tally("reward function f", "row(s), scored 0")
    scorer = SimpleNamespace(fns=SimpleNamespace(tallies={"f": reward}))
    for batch in range(5):  # dynamic sampling's batches, evaluations' chunks, threads
        env.add(2, f"episode {batch}: env.step: boom")
        reward.add(3, f"error on the rows from {batch}")
    tools.add(1, "episode 7: tool add: error: ValueError")
    with caplog.at_level(logging.WARNING):
        say_failures("step 4", scorer, (env, tools))
        say_failures("step 5", scorer, (env, tools))
    assert [r.getMessage() for r in caplog.records] == [
        "step 4: reward function f failed in 15 row(s), scored 0; first: error on the rows "
        "from 0",
        "step 4: environment e.py:E failed in 10 episode turn(s); first: episode 0: env.step: "
        "boom",
        "step 4: the tools failed in 1 episode turn(s); first: episode 7: tool add: error: "
        "ValueError"]

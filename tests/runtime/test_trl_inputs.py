"""Issue 40, item 2: reward functions get what TRL's GRPOTrainer passes them: message lists
for rows in chat form, `completion_ids`, every column but `prompt` / `completion`, and
`trainer_state` (step, epoch) during training. The two
TRL functions below are copies written from TRL's documented behaviour (`trl.rewards`:
`accuracy_reward` reads `completion[0]["content"]`, `think_format_reward` matches one
leading <think>...</think> block), not imported from TRL."""

import numpy as np

from compiler.vocab import RewardKind
from locojax.data import Problem
from locojax.rewards import RewardSettings, Scorer
from locojax.runtime.hostwork import score_problems

FNS = '''
import json, re

def accuracy_reward(completions, solution, **kwargs):
    contents = [completion[0]["content"] for completion in completions]
    return [float(c.strip() == s) for c, s in zip(contents, solution)]

def think_format_reward(completions, **kwargs):
    pattern = r"^<think>(?!.*<think>)(.*?)</think>.*$"
    return [1.0 if re.match(pattern, c[0]["content"], re.DOTALL) else 0.0 for c in completions]

def state(prompts, completions, trainer_state=None, **columns):
    return [-1.0 if trainer_state is None else trainer_state["step"] + trainer_state["epoch"]
            for _ in completions]

def seen(prompts, completions, completion_ids, **columns):
    return [float(len(ids)) + (100.0 if "prompt" in columns else 0.0)
            + (1000.0 if isinstance(p, list) and p[-1]["role"] == "user" else 0.0)
            for p, ids in zip(prompts, completion_ids)]
'''


def _problems(chat: bool) -> list[Problem]:
    msgs = (("system", "be brief"), ("user", "2+2?")) if chat else None
    return [Problem(uid=f"t/train/{i}", question="2+2?", answer="4", messages=msgs,
                    columns={"solution": "4", "prompt": "dropped", "level": i})
            for i in range(2)]


def _score(tmp_path, chat: bool, *names: str, step: int | None = None):
    path = tmp_path / "trl_fns.py"
    path.write_text(FNS)
    settings = RewardSettings(kind=RewardKind.python, timeout_s=10.0,
                              reward_fns={n: f"{path}:{n}" for n in names})
    texts = ["4", "<think>hm</think>5", "<think>a</think>4", "5"]
    ids = [[1], [2, 3], [4, 5, 6], [7, 8, 9, 10]]
    with Scorer(settings, workers=2) as scorer:
        if step is not None:
            scorer.set_step(step, prompts_per_step=8, train_rows=32)
        return score_problems(scorer, texts, _problems(chat), 2, "{question}",
                              [{"completion_ids": x} for x in ids])


def test_trl_functions_run_unchanged_on_chat_rows(tmp_path):
    got = _score(tmp_path, True, "accuracy_reward", "think_format_reward")
    np.testing.assert_array_equal(got.rewards_B, [1.0, 1.0, 1.0, 0.0])
    assert got.fn_sums == {"accuracy_reward": 1.0, "think_format_reward": 2.0}


def test_completion_ids_and_columns_reach_the_function_but_not_prompt(tmp_path):
    chat = _score(tmp_path, True, "seen").rewards_B
    plain = _score(tmp_path, False, "seen").rewards_B
    np.testing.assert_array_equal(chat, [1001.0, 1002.0, 1003.0, 1004.0])
    np.testing.assert_array_equal(plain, [1.0, 2.0, 3.0, 4.0])


def test_trainer_state_is_the_step_and_its_epoch_on_every_chunk(tmp_path):
    np.testing.assert_array_equal(_score(tmp_path, False, "state").rewards_B, [-1.0] * 4)
    # step 3 of 8 prompts over 32 rows: epoch 0.75, on both workers' chunks
    np.testing.assert_array_equal(_score(tmp_path, False, "state", step=3).rewards_B,
                                  [3.75] * 4)

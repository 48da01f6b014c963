"""workload=reasoning_gym (issue 38 item 10): a reasoning-gym task's rows generated alike on
every host, scored in the reward workers by the task's own score_answer."""

import dataclasses
import sys

import pytest

from compiler import compile_plan
from compiler.errors import PlanError
from locojax.config.compose import compose_config
from locojax.data import DataError, GymSettings, WorkloadSettings, load_workload
from locojax.rewards.reasoning_gym import score
from locojax.rewards.scorer import RewardSettings, Scorer
from locojax.runtime.assemble import reward_settings, workload_settings

SMALL = ["+experiment=reasoning_gym_co", "model=tiny", "mesh=cpu",
         "workload.reasoning_gym.size=12", "workload.reasoning_gym.eval_size=4"]


def _settings(*extra: str) -> WorkloadSettings:
    return workload_settings(compile_plan(compose_config([*SMALL, *extra])).workload)


def test_the_tasks_rows_are_the_same_on_every_load_and_keep_answer_and_metadata():
    settings = _settings("workload.reasoning_gym.task=chain_sum")
    first, again = load_workload(settings, seed=0), load_workload(settings, seed=5)
    assert (len(first.train), len(first.eval), first.skipped) == (12, 4, 0)
    assert [p.question for p in first.train] == [p.question for p in again.train]
    p = first.train[0]
    assert p.uid == "reasoning_gym/train/0" and p.answer == p.columns["answer"]
    assert p.columns["metadata"]["source_dataset"] == "chain_sum"
    # The held-out rows come from the next seed: another stream of problems.
    assert {q.question for q in first.eval} != {q.question for q in first.train[:4]}
    other = load_workload(dataclasses.replace(settings, reasoning_gym=dataclasses.replace(
        settings.reasoning_gym, seed=1)), seed=0)
    assert [q.question for q in other.train[:4]] == [q.question for q in first.eval]


def test_score_is_the_tasks_score_answer_on_the_answer_tags():
    rows = load_workload(_settings(), seed=0).train[:3]
    answers = [p.columns["answer"] for p in rows]
    metadata = [p.columns["metadata"] for p in rows]
    completions = [f"so it is <answer>{answers[0]}</answer>", "<answer>nonsense</answer>",
                   [{"role": "assistant", "content": f"<answer> {answers[2]} </answer>"}]]
    assert score([""] * 3, completions, answers, metadata) == [1.0, 0.0, 1.0]
    assert score([""], [answers[0]], answers[:1], metadata[:1]) == [0.0]  # no tags


def test_the_workloads_reward_runs_in_the_workers_and_decides_correct():
    plan = compile_plan(compose_config(SMALL))
    settings = reward_settings(plan.workload)
    assert settings.reward_fns == {"score": "locojax.rewards.reasoning_gym:score"}
    rows = load_workload(workload_settings(plan.workload), seed=0).train[:2]
    with Scorer(settings) as scorer:
        got = scorer.score_batch([f"<answer>{rows[0].answer}</answer>", "<answer>x</answer>"],
                                 [p.answer for p in rows], columns=[p.columns for p in rows])
    assert got.rewards_B.tolist() == [1.0, 0.0] and got.correct_B.tolist() == [True, False]
    assert isinstance(settings, RewardSettings)


def test_the_run_says_the_data_is_the_task_generated(tmp_path, capsys):
    from locojax.runtime.rundir.provenance import announce

    announce(compile_plan(compose_config([*SMALL, "workload.reasoning_gym.task=chain_sum"])),
             tmp_path)
    assert ("data: reasoning-gym task chain_sum, generated (12 train rows from seed 0, 4 eval "
            "rows from seed 1): nothing read") in capsys.readouterr().out.splitlines()


def test_an_unknown_task_a_missing_package_and_a_builtin_reward_are_one_line(monkeypatch):
    with pytest.raises(DataError, match=r"task=basic_arithmetc: not a reasoning-gym task "
                                        r"\(did you mean basic_arithmetic"):
        load_workload(_settings("workload.reasoning_gym.task=basic_arithmetc"), seed=0)
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # not installed
    with pytest.raises(DataError, match=r"needs the reasoning-gym package .*"
                                        r"pip install -e '\.\[reasoning-gym\]'"):
        load_workload(_settings(), seed=0)
    with pytest.raises(PlanError, match=r"workload.reasoning_gym.task=basic_arithmetic: must be "
                                        r"empty unless workload.reward=python"):
        compile_plan(compose_config([*SMALL, "workload.reward=gsm8k"]))
    assert GymSettings().task == ""  # other workloads are not reasoning-gym ones

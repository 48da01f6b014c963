"""verifiers 0.4 environments driven by LoCoJAX's replies (`locojax.hubs.verifiers`): a
taskset's tasks are the rows; an Env's run() plays the user between LoCoJAX's replies; the
task's @stop hooks and a seat's max_turns end an exchange as verifiers ends it; its @reward
functions (its rubric) and run()'s own records are the reward; the package's own
SingleAgentEnv runs a plain taskset; what LoCoJAX cannot play is one line. Skips without the
`verifiers` extra (CI's `test` extra has it)."""

import gc
import warnings

import pytest
from paths import ROOT

pytest.importorskip("verifiers.v1", reason="the verifiers extra: pip install -e '.[verifiers]'")

from compiler import compile_plan  # noqa: E402
from compiler.errors import PlanError  # noqa: E402
from compiler.vocab import EnvHub  # noqa: E402
from locojax.config.compose import compose_config  # noqa: E402
from locojax.data import DataError, load_workload  # noqa: E402
from locojax.envs.errors import EnvError  # noqa: E402
from locojax.envs.runner import EnvRunner, EnvSpec  # noqa: E402
from locojax.envs.user_code import load_env_class  # noqa: E402
from locojax.hubs import HUBS, HubError, code_of, hub_of  # noqa: E402
from locojax.hubs import verifiers as hub  # noqa: E402
from locojax.runtime.assemble import workload_settings  # noqa: E402

GUESS = str(ROOT / "examples" / "hubs" / "vf_guess.py")

PLAIN = '''
import verifiers.v1 as vf


class EchoData(vf.TaskData):
    answer: str


class EchoTask(vf.Task[EchoData]):
    @vf.reward(weight=0.5)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.reward
    async def short(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) < 10)


class EchoTaskset(vf.Taskset[EchoTask, vf.TasksetConfig]):
    def load(self):
        return [EchoTask(EchoData(prompt=f"Say {w}.", system_prompt="Be brief.", answer=w),
                         self.config.task) for w in ("yes", "no")]


__all__ = ["EchoTaskset"]
'''

TWO_SEATS = '''
import verifiers.v1 as vf
from vf_echo import EchoTaskset


class DuoConfig(vf.EnvConfig):
    user: vf.AgentConfig = vf.AgentConfig()
    assistant: vf.AgentConfig = vf.AgentConfig()


class DuoEnv(vf.Env[DuoConfig]):
    async def run(self, task, agents):
        raise AssertionError("never run")


__all__ = ["DuoEnv", "EchoTaskset"]
'''

FAILS = '''
import verifiers.v1 as vf
from vf_echo import EchoTaskset


class FailsConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(max_turns=2)


class FailsEnv(vf.Env[FailsConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as it:
            segment = await it.turn()
            while not segment.terminated:
                if segment.last_reply == "boom":
                    raise RuntimeError("the engine broke")
                segment = await it.turn("again")
        it.trace.record_reward("turns", float(it.trace.num_turns), 0.25)


__all__ = ["EchoTaskset", "FailsEnv"]
'''


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """The test's taskset modules, importable by name (as an installed taskset package is)."""
    for name, text in (("vf_echo", PLAIN), ("vf_duo", TWO_SEATS), ("vf_fails", FAILS)):
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _episode(spec: str, row: dict, args: dict | None = None):
    cls = hub.env_class(spec, args or {})
    return cls({**row, "seed": 7})


def test_every_hub_of_the_vocabulary_has_a_record_and_specs_split_at_the_first_colon():
    assert set(HUBS) == set(EnvHub)
    assert hub_of("examples/guess/env.py:GuessNumber") is None and hub_of("") is None
    got = hub_of("verifiers:a/b.py")
    assert got is not None and got[0].name == "verifiers" and got[1] == "a/b.py"
    with pytest.raises(HubError, match="name the environment after 'openenv:'"):
        hub_of("openenv:")
    assert code_of("verifiers:x.py") == "x.py:load" and code_of("a.py:C") == "a.py:C"
    assert code_of("verifiers:textarena").endswith("v1/tasksets/textarena/__init__.py:load")


def test_the_tasksets_tasks_are_the_rows_with_its_config_from_env_args():
    rows, source = hub.rows(GUESS, {"high": "5", "num_tasks": "6"})
    assert source == "verifiers taskset vf_guess (6 tasks)" and len(rows) == 6
    assert rows[0]["question"] == "Guess my number from 1 to 5."
    assert [r["answer"] for r in rows] == ["1", "3", "5", "2", "4", "1"]
    assert rows[2]["vf_task"]["answer"] == "5" and rows[2]["vf_task"]["idx"] == 2
    with pytest.raises(HubError, match=r"^workload.env=verifiers:.*vf_guess.py: taskset.high: "
                                       r"Input should be a valid integer"):
        hub.rows(GUESS, {"high": "many"})
    with pytest.raises(HubError, match="taskset 'no_such_taskset' not found"):
        hub.rows("no_such_taskset", {})


def test_the_workload_takes_the_rows_and_holds_out_its_eval_fraction():
    cfg_args = ["workload=hub", f"workload.env=verifiers:{GUESS}", "model.vocab=100",
                "model.tokenizer=ascii", "workload.chat_template=false"]
    cfg = compose_config([*cfg_args, "+workload.env_args.num_tasks=16"])
    w = load_workload(workload_settings(compile_plan(cfg).workload), seed=0)
    assert len(w.train) + len(w.eval) == 16 and len(w.eval) >= 1 and w.skipped == 0
    p = w.train[0]
    assert p.question.startswith("Guess my number") and "vf_task" in p.columns
    with pytest.raises(PlanError, match="workload.env_args"):
        compile_plan(compose_config(["+workload.env_args.high=5"]))
    files = workload_settings(compile_plan(compose_config(
        [*cfg_args, "+workload.data_files.train=examples/guess/train.jsonl"])).workload)
    with pytest.raises(DataError, match="workload.data_files: workload.env=verifiers:.* brings "
                                        "its own rows"):
        load_workload(files, seed=0)


def test_run_plays_the_user_between_the_replies_and_the_rubric_scores_the_trace():
    rows, _ = hub.rows(GUESS, {"high": "5"})
    env = _episode(GUESS, rows[1])  # the secret is 3
    assert env.reset() == [{"role": "user", "content": "Guess my number from 1 to 5."}]
    assert env.step("2") == ([{"role": "user", "content": "No: higher."}], None, False)
    assert env.step("I say 4") == ([{"role": "user", "content": "No: lower."}], None, False)
    assert env.step("3") == ([], 1.0, True)
    # an empty reply fires the task's @stop (after the response): the exchange ends, scored 0
    env = _episode(GUESS, rows[1])
    env.reset()
    assert env.step("") == ([], 0.0, True)


def test_the_packages_single_agent_env_plays_a_plain_taskset_in_one_reply(modules):
    cls = hub.env_class("vf_echo", {})
    assert type(cls.env).__name__ == "SingleAgentEnv"
    rows, _ = hub.rows("vf_echo", {})
    env = cls({**rows[0], "seed": 1})
    assert env.reset() == [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Say yes."}]
    # weights: exact 0.5, short 1.0
    assert env.step("yes") == ([], 1.5, True)
    env = cls({**rows[1], "seed": 1})
    env.reset()
    assert env.step("definitely not") == ([], 0.0, True)


def test_a_seats_max_turns_ends_the_exchange_and_runs_records_count(modules):
    rows, _ = hub.rows("vf_fails", {})
    env = _episode("vf_fails", rows[0])
    env.reset()
    assert env.step("a") == ([{"role": "user", "content": "again"}], None, False)
    # max_turns=2: the third turn is refused; run()'s record (2 turns x 0.25) and the rubric
    # (exact 0 x 0.5, short 1 x 1.0) add up
    assert env.step("b") == ([], 1.5, True)


def test_an_environment_that_raises_fails_its_episode_and_an_abandoned_one_is_cancelled(
        modules):
    rows, _ = hub.rows("vf_fails", {})
    env = _episode("vf_fails", rows[0])
    env.reset()
    with pytest.raises(RuntimeError, match="the engine broke"):
        env.step("boom")
    env = _episode("vf_fails", rows[0])
    env.reset()
    driver = env.driver
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del env
        gc.collect()
    assert driver.main.cancelled()


def test_what_locojax_cannot_play_is_one_line(modules):
    with pytest.raises(HubError, match=r"DuoEnv has the seats \['assistant', 'user'\]: "
                                       "LoCoJAX plays one"):
        hub.env_class("vf_duo", {})
    with pytest.raises(HubError, match="a row without a vf_task column"):
        hub.env_class("vf_echo", {})({"question": "q"})
    with pytest.raises(EnvError, match=r"^workload.env=verifiers:.*nope.py: no file"):
        load_env_class("verifiers:nope.py")


def test_episodes_run_in_the_env_workers_with_the_env_args():
    rows, _ = hub.rows(GUESS, {"high": "5"})
    spec = EnvSpec(env=f"verifiers:{GUESS}", tools=(), step_timeout_s=60, tool_timeout_s=5,
                   workers=1, env_args=(("high", "5"),))
    runner = EnvRunner(spec)
    try:
        openings = runner.open([{**r, "prompt": r["question"], "seed": i}
                                for i, r in enumerate(rows[:2])])
        assert openings[1] == [{"role": "user", "content": "Guess my number from 1 to 5."}]
        got = runner.step({0: "1", 1: "1"})
        assert (got[0].done, got[0].reward) == (True, 1.0)
        assert (got[1].done, got[1].messages) == (False, ({"role": "user",
                                                           "content": "No: higher."},))
    finally:
        runner.close()

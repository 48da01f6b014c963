"""Environments and tools of the user's, run in worker processes (`locojax.envs.runner`): turns,
rewards and done; tool results and tool errors counted (raise, timeout, malformed, unknown);
an env that raises ends its episode; a wrong return type, a missing file, class or `step` is
one line naming the spec; episodes keep their state in their worker; workers ignore Ctrl-C and
die with their parent."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from locojax.envs.errors import EnvError
from locojax.envs.runner import MALFORMED, RESTARTED, EnvRunner, EnvSpec
from locojax.envs.tools import tool_result_text

ENVS = '''
import os
import time

class Guess:
    def __init__(self, row):
        self.target, self.turns = row["target"], 0

    def reset(self):
        return [{"role": "user", "content": "Guess a number from 1 to 10."}]

    def step(self, reply):
        self.turns += 1
        guess = int(reply.strip())
        if guess == self.target:
            return [], 1.0, True
        if self.turns == 3:
            return [{"role": "user", "content": "out of turns"}], -1, True
        return [{"role": "user", "content": "higher" if guess < self.target else "lower"}], None, False

class Counter:
    def __init__(self, row):
        self.id, self.n = row["id"], 0

    def step(self, reply):
        self.n += 1
        return [{"role": "user", "content": f"{self.id}:{self.n}:{os.getpid()}"}], 0.0, False

class Raises:
    def __init__(self, row):
        pass

    def step(self, reply):
        raise RuntimeError("kaput\\nsecond line")

class Sleeps(Raises):
    def step(self, reply):
        time.sleep(10)

class ResetRaises(Counter):
    def reset(self):
        raise KeyError("no such level")

class NoStep:
    def __init__(self, row):
        pass
'''

TOOLS = '''
import os
import time

def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b

def boom(text: str) -> str:
    """Raise an error.

    Args:
        text: Any text.
    """
    raise ValueError("bad input\\nsecond line")

def slow(text: str) -> str:
    """Sleep past the limit.

    Args:
        text: Any text.
    """
    time.sleep(10)
    return text

def pid() -> int:
    """The worker's process id."""
    return os.getpid()

def nohints(x):
    return x
'''

LIMIT_S = 0.5


def call(name: str, **arguments) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "envs.py").write_text(ENVS)
    (tmp_path / "tools.py").write_text(TOOLS)
    return tmp_path


@pytest.fixture
def make(files: Path):
    runners = []

    def make(env: str = "", tools: tuple[str, ...] = (), workers: int = 1) -> EnvRunner:
        spec = EnvSpec(env=f"{files}/envs.py:{env}" if env else "",
                       tools=tuple((name, f"{files}/tools.py:{name}") for name in tools),
                       step_timeout_s=LIMIT_S, tool_timeout_s=LIMIT_S, workers=workers)
        runners.append(EnvRunner(spec))
        return runners[-1]

    yield make
    for runner in runners:
        runner.close()


def test_guess_a_number_over_three_turns(make):
    runner = make("Guess")
    rows = [{"prompt": "p0", "target": 7}, {"prompt": "p1", "target": 3}]
    assert runner.open(rows) == [[{"role": "user", "content": "Guess a number from 1 to 10."}]] * 2
    first = runner.step({0: "5", 1: "5"})
    assert [first[i].messages for i in (0, 1)] == [({"role": "user", "content": "higher"},),
                                                  ({"role": "user", "content": "lower"},)]
    assert all(r.reward == 0.0 and not r.done and r.env_error is None for r in first.values())
    second = runner.step({0: "7", 1: "4"})
    assert (second[0].messages, second[0].reward, second[0].done) == ((), 1.0, True)
    assert (second[1].reward, second[1].done) == (0.0, False)
    third = runner.step({1: "9"})
    assert third[1].messages == ({"role": "user", "content": "out of turns"},)
    assert (third[1].reward, third[1].done, third[1].tool_calls) == (-1.0, True, 0)
    assert third[1].seconds >= 0.0
    with pytest.raises(ValueError, match=r"episodes \[0\] are not open"):
        runner.step({0: "1"})


def test_episodes_keep_their_state_in_their_worker(make):
    runner = make("Counter", workers=2)
    openings = runner.open([{"prompt": f"p{i}", "id": i} for i in range(4)])
    assert openings == [[{"role": "user", "content": f"p{i}"}] for i in range(4)]
    seen = {}
    for turn in (1, 2):
        results = runner.step({i: "x" for i in range(4)})
        for i, r in results.items():
            episode, n, pid = r.messages[0]["content"].split(":")
            assert (int(episode), int(n)) == (i, turn)
            assert seen.setdefault(i, pid) == pid  # the same worker every turn
    assert len(set(seen.values())) == 2


def test_tools_only_runs_a_call_and_a_reply_without_one_ends(make, files):
    runner = make(tools=("add", "boom"))
    schemas = runner.check()
    assert [s["function"]["name"] for s in schemas] == ["add", "boom"]
    assert runner.open([{"prompt": "2 + 3?"}]) == [[{"role": "user", "content": "2 + 3?"}]]
    turn = runner.step({0: "let me add " + call("add", a=2, b=3)})[0]
    assert turn.messages == ({"role": "tool", "content": tool_result_text(5)},)
    assert (turn.done, turn.tool_calls, turn.tool_errors, turn.env_error) == (False, 1, 0, None)
    last = runner.step({0: "The answer is 5."})[0]
    assert (last.messages, last.done, last.reward, last.tool_calls) == ((), True, 0.0, 0)


def test_a_tool_name_is_the_configured_one(files):
    spec = EnvSpec(env="", tools=(("plus", f"{files}/tools.py:add"),), step_timeout_s=1,
                   tool_timeout_s=1, workers=1)
    runner = EnvRunner(spec)
    try:
        assert [s["function"]["name"] for s in runner.check()] == ["plus"]
        runner.open([{"prompt": "p"}])
        assert runner.step({0: call("plus", a=1, b=1)})[0].messages[0]["content"] == \
            tool_result_text(2)
    finally:
        runner.close()


def test_tool_errors_are_counted_and_told_to_the_model(make):
    runner = make(tools=("add", "boom"))
    runner.open([{"prompt": "p"}] * 3)
    turns = runner.step({0: call("boom", text="x") + call("add", a=1, b=2),
                         1: "<tool_call>{not json</tool_call>",
                         2: call("nope", x=1)})
    assert turns[0].messages == ({"role": "tool", "content": "error: ValueError: bad input"},
                                 {"role": "tool", "content": tool_result_text(3)})
    assert (turns[0].tool_calls, turns[0].tool_errors, turns[0].done) == (2, 1, False)
    assert turns[1].messages == ({"role": "tool", "content": MALFORMED},)
    assert (turns[1].tool_calls, turns[1].tool_errors, turns[1].done) == (0, 1, False)
    assert turns[2].messages == ({"role": "tool", "content": "error: unknown tool nope"},)
    assert (turns[2].tool_calls, turns[2].tool_errors, turns[2].done) == (0, 1, False)
    env, tools = (tally.take() for tally in runner.tallies)  # the step tells them once
    assert env is None and "failed in 1 episode turn(s)" in tools and "boom" in tools


def test_a_tool_past_its_limit_is_stopped_and_its_worker_restarted(make):
    runner = make(tools=("slow", "pid"))
    runner.open([{"prompt": "p"}])
    before = runner.step({0: call("pid")})[0].messages[0]["content"]
    start = time.monotonic()
    turn = runner.step({0: call("slow", text="x")})[0]
    assert time.monotonic() - start < 5
    assert turn.messages == ({"role": "tool", "content": f"error: timed out after {LIMIT_S:g} s"},)
    assert (turn.tool_calls, turn.tool_errors, turn.done, turn.env_error) == (1, 1, False, None)
    after = runner.step({0: call("pid")})[0].messages[0]["content"]
    assert after != before  # a new worker; the episode (no environment) goes on


def test_a_killed_worker_ends_the_episodes_whose_environments_it_held(make):
    runner = make("Counter", tools=("slow",))
    runner.open([{"prompt": "p", "id": i} for i in range(3)])
    runner.step({2: "x"})
    turns = runner.step({0: call("slow", text="x"), 1: "x"})
    assert (turns[0].done, turns[0].env_error, turns[0].tool_errors) == (True, RESTARTED, 1)
    assert (turns[1].done, turns[1].env_error) == (True, RESTARTED)
    assert runner.step({2: "x"})[2].env_error == RESTARTED  # stepped before the restart


def test_an_env_that_raises_or_hangs_ends_its_episode(make):
    runner = make("Raises")
    runner.open([{"prompt": "p"}])
    turn = runner.step({0: "x"})[0]
    assert (turn.done, turn.reward, turn.env_error) == (True, 0.0,
                                                         "env.step: RuntimeError: kaput")
    env, tools = (tally.take() for tally in runner.tallies)
    assert "failed in 1 episode turn(s)" in env and "kaput" in env and tools is None
    runner = make("Sleeps")
    runner.open([{"prompt": "p"}])
    turn = runner.step({0: "x"})[0]
    assert (turn.done, turn.env_error) == (True, f"env.step: timed out after {LIMIT_S:g} s")


def test_a_reset_that_raises_ends_the_episode_at_its_first_step(make):
    runner = make("ResetRaises")
    assert runner.open([{"prompt": "p", "id": 0}]) == [[{"role": "user", "content": "p"}]]
    turn = runner.step({0: "x"})[0]
    assert (turn.done, turn.env_error) == (True, "env.reset: KeyError: 'no such level'")


@pytest.mark.parametrize("returned, problem", [
    ("[], 0.0, True", None),
    ("'text'", "not a tuple of 3"),
    ("[{'role': 'assistant', 'content': 'x'}], 0.0, True", "message 0 is"),
    ("[{'role': 'user', 'content': 3}], 0.0, True", "message 0 is"),
    ("[], float('nan'), True", "the reward is nan"),
    ("[], '1.0', True", "the reward is a str"),
    ("[], 1.0, 'yes'", "done is a str"),
])
def test_a_wrong_step_return_is_the_users_bug(files, returned, problem):
    (files / "bad.py").write_text(f"class Bad:\n    def __init__(self, row):\n        pass\n"
                                  f"    def step(self, reply):\n        return {returned}\n")
    spec = EnvSpec(env=f"{files}/bad.py:Bad", tools=(), step_timeout_s=5, tool_timeout_s=5,
                   workers=1)
    runner = EnvRunner(spec)
    try:
        runner.open([{"prompt": "p"}])
        if problem is None:
            assert runner.step({0: "x"})[0].done
            return
        with pytest.raises(EnvError) as err:
            runner.step({0: "x"})
        line = str(err.value)
        assert "\n" not in line and f"environment {files}/bad.py:Bad.step returned" in line
        assert "expected (list[dict], float | None, bool)" in line and problem in line
    finally:
        runner.close()


@pytest.mark.parametrize("env, tool, said", [
    ("missing.py:Guess", "", "no file"),
    ("envs.py:Gone", "", "has no class 'Gone'"),
    ("envs.py", "", "write <path/to/file.py>:<class>"),
    ("no_such_module_xyz:Guess", "", "cannot import no_such_module_xyz"),
    ("envs.py:NoStep", "", "NoStep has no step method"),
    ("", "tools.py:nohints", "tool 'nohints'"),
    ("", "tools.py:absent", "has no function 'absent'"),
])
def test_user_code_that_does_not_load_is_one_line(files, env, tool, said):
    where = lambda spec: spec if ".py" not in spec else f"{files}/{spec}"  # noqa: E731
    spec = EnvSpec(env=where(env) if env else "",
                   tools=((tool.partition(":")[2], where(tool)),) if tool else (),
                   step_timeout_s=5, tool_timeout_s=5, workers=2)
    runner = EnvRunner(spec)
    with pytest.raises(EnvError) as err:
        runner.check()
    line = str(err.value)
    assert "\n" not in line and said in line and (env or tool).partition(":")[0] in line


def test_workers_ignore_ctrl_c_and_die_with_their_parent(make, files):
    runner = make(tools=("pid",))
    runner.open([{"prompt": "p"}])
    pid = int(runner.step({0: call("pid")})[0].messages[0]["content"])
    os.kill(pid, signal.SIGINT)
    time.sleep(0.2)
    assert runner.step({0: call("pid")})[0].messages[0]["content"] == str(pid)

    script = (f"import os\nfrom locojax.envs.runner import EnvRunner, EnvSpec\n"
              f"r = EnvRunner(EnvSpec('', (('pid', '{files}/tools.py:pid'),), 5, 5, 1))\n"
              f"r.open([{{'prompt': 'p'}}])\n"
              f"print(r.step({{0: {call('pid')!r}}})[0].messages[0]['content'], flush=True)\n"
              f"os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).resolve().parents[2])
    orphan = int(out.stdout.strip())
    deadline = time.monotonic() + 10
    while _alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(orphan)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")

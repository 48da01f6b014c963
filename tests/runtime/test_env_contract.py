"""Issue 62, item 2: environment classes of the user's. A `reset` or `step` that returns the
wrong type or shape, a message of an unknown role or a content that is no str, is one line
naming the class (`EnvError`: exit 2 at the door) at the first such return; a `step` that
blocks past its limit ends its episode, counted, its worker replaced, and the next episodes
run; the processes an environment starts (in its process group, in a session of their own, or
a daemon's double fork) die with its worker; an environment that changes the working
directory, `os.environ` or `sys.path` at import changes nothing of the trainer. Through
`python -m locojax`: tests/e2e/test_env_faults.py."""

import os
import sys
import time
from pathlib import Path

import psutil
import pytest
from processes import ended

from locojax.envs.errors import EnvError
from locojax.envs.runner import RESTARTED, EnvRunner, EnvSpec

SPAWNS = '''
import os
import subprocess
import time

PIDS = os.environ["SPAWNED_PIDS"]


def _note(pid):
    with open(PIDS, "a") as f:
        f.write(f"{pid}\\n")


class Spawns:
    """Starts a child in its group, one in a session of its own, and a daemon (double fork);
    its step hangs on turn 1."""

    def __init__(self, row):
        self.row = row

    def reset(self):
        _note(subprocess.Popen(["sleep", "600"]).pid)
        _note(subprocess.Popen(["sleep", "600"], start_new_session=True).pid)
        if os.fork() == 0:  # the daemon: its parent exits, it is nobody's child
            os.setsid()
            if os.fork() == 0:
                _note(os.getpid())
                time.sleep(600)
            os._exit(0)
        return [{"role": "user", "content": "go"}]

    def step(self, reply):
        if self.row.get("hang"):
            time.sleep(600)
        return [], 1.0, True
'''
MOVES = '''
import os
import sys

os.chdir("/")
os.environ["HOME"] = "/nowhere"
os.environ["LOCOJAX_ENV_WAS_HERE"] = "1"
sys.path.insert(0, "/nowhere")


class Moves:
    def __init__(self, row):
        pass

    def step(self, reply):
        return [{"role": "user", "content": os.getcwd()}], 0.0, False
'''


def _runner(path: Path, cls: str, timeout_s: float = 5.0, workers: int = 1) -> EnvRunner:
    return EnvRunner(EnvSpec(env=f"{path}:{cls}", tools=(), step_timeout_s=timeout_s,
                             tool_timeout_s=5, workers=workers))


def _bad(tmp_path: Path, reset: str = "[{'role': 'user', 'content': 'x'}]",
         step: str = "[], 0.0, True") -> EnvRunner:
    path = tmp_path / "bad.py"
    path.write_text(f"class Bad:\n    def __init__(self, row):\n        pass\n"
                    f"    def reset(self):\n        return {reset}\n"
                    f"    def step(self, reply):\n        return {step}\n")
    return _runner(path, "Bad")


@pytest.mark.parametrize("returned, problem", [
    ("'hello'", "the messages are a str"),
    ("None", "the messages are a NoneType"),
    ("[]", "no message"),
    ("{'role': 'user', 'content': 'x'}", "the messages are a dict"),
    ("['hello']", "message 0 is 'hello'"),
    ("[{'role': 'wizard', 'content': 'x'}]", "message 0 is"),
    ("[{'role': 'assistant', 'content': 'x'}]", "message 0 is"),
    ("[{'role': 'user', 'content': None}]", "message 0 is"),
    ("[{'role': 'user', 'content': ['x']}]", "message 0 is"),
    ("[{'role': 'user'}]", "message 0 is"),
])
def test_a_reset_that_returns_no_messages_is_one_line_naming_the_class(tmp_path, returned,
                                                                       problem):
    runner = _bad(tmp_path, reset=returned)
    try:
        with pytest.raises(EnvError) as err:
            runner.open([{"prompt": "p"}, {"prompt": "q"}])
    finally:
        runner.close()
    line = str(err.value)
    assert "\n" not in line and f"environment {tmp_path}/bad.py:Bad.reset returned" in line
    assert problem in line, line


@pytest.mark.parametrize("returned, problem", [
    ("[{'role': 'wizard', 'content': 'x'}], 0.0, False", "message 0 is"),
    ("[{'role': 'user', 'content': b'x'}], 0.0, False", "message 0 is"),
    ("({'role': 'user', 'content': 'x'},), 0.0", "not a tuple of 3"),
    ("{'role': 'user', 'content': 'x'}, 0.0, False", "the messages are a dict"),
    ("[], 0.0, None", "done is a NoneType"),
    ("[], [1.0], True", "the reward is a list"),
    ("[], float('inf'), True", "the reward is inf"),
])
def test_a_step_of_the_wrong_shape_is_one_line_at_its_first_return(tmp_path, returned,
                                                                    problem):
    runner = _bad(tmp_path, step=returned)
    try:
        runner.open([{"prompt": "p"}])
        with pytest.raises(EnvError) as err:
            runner.step({0: "x"})
    finally:
        runner.close()
    line = str(err.value)
    assert "\n" not in line and f"environment {tmp_path}/bad.py:Bad.step returned" in line
    assert problem in line, line


def _noted(path: Path, n: int) -> list[int]:
    """The n pids noted in `path` (the daemon notes its own a moment after `reset`)."""
    deadline = time.monotonic() + 10
    while len(path.read_text().split()) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return [int(x) for x in path.read_text().split()]


def test_a_hung_step_ends_its_episode_and_its_processes_die_with_the_worker(tmp_path,
                                                                          monkeypatch):
    (tmp_path / "spawns.py").write_text(SPAWNS)
    pids = tmp_path / "pids"
    monkeypatch.setenv("SPAWNED_PIDS", str(pids))
    runner = _runner(tmp_path / "spawns.py", "Spawns", timeout_s=1.0)
    try:
        runner.open([{"prompt": "p", "hang": True}, {"prompt": "p"}])
        first = _noted(pids, 6)
        assert len(first) == 6 and all(psutil.pid_exists(p) for p in first)
        start = time.monotonic()
        turns = runner.step({0: "x", 1: "x"})
        assert time.monotonic() - start < 10
        assert (turns[0].done, turns[0].env_error) == (True, "env.step: timed out after 1 s")
        assert (turns[1].done, turns[1].env_error) == (True, RESTARTED)  # held by that worker
        assert all(ended(p, 10) for p in first), [p for p in first if not ended(p, 0)]
        assert "failed in 1 episode turn(s)" in runner.tallies[0].take()
        pids.write_text("")
        runner.open([{"prompt": "p"}])  # a new worker; the run goes on
        assert runner.step({0: "x"})[0].reward == 1.0
        second = _noted(pids, 3)
    finally:
        runner.close()
    assert len(second) == 3 and all(ended(p, 10) for p in second)  # closed: gone with it


def test_an_env_that_moves_cwd_environ_and_sys_path_at_import_moves_nothing_here(tmp_path):
    (tmp_path / "moves.py").write_text(MOVES)
    cwd, environ, path = os.getcwd(), dict(os.environ), list(sys.path)
    runner = _runner(tmp_path / "moves.py", "Moves", workers=2)
    try:
        runner.open([{"prompt": "p"}, {"prompt": "p"}])
        turns = runner.step({0: "x", 1: "x"})
    finally:
        runner.close()
    assert turns[0].messages[0]["content"] == "/"  # it moved its own worker
    assert (os.getcwd(), dict(os.environ), sys.path) == (cwd, environ, path)
    assert "moves" not in sys.modules

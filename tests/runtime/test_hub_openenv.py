"""OpenEnv 0.10 environments in-process (`locojax.hubs.openenv`): the package's own echo
environment (its `openenv init` template, rendered by OpenEnv's own code: no network) built
in the worker with no server; a reply becomes its Action, an observation the next user
message with its reward and done; a reply that is no action gets the validation error; a
TaskProvider's tasks are the rows. The parsing tests run everywhere; the rest skip without
the `openenv` extra, which cannot be installed beside `verifiers` (CI's `test` has verifiers:
pyproject.toml says why)."""

import importlib.util
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from locojax.hubs import HubError
from locojax.hubs import openenv as hub

HAS_OPENENV = importlib.util.find_spec("openenv") is not None
needs_openenv = pytest.mark.skipif(not HAS_OPENENV, reason="the openenv extra: "
                                   "pip install -e '.[openenv]' (not beside verifiers)")
ECHO = "echo_env.server.echo_env_environment:EchoEnvironment"

TASKS = '''
from echo_env.server.echo_env_environment import EchoEnvironment


class Listed(EchoEnvironment):
    def __init__(self, prefix="say"):
        super().__init__()
        self.prefix = prefix

    def list_splits(self):
        return ["train"]

    def list_tasks(self, split):
        return [f"{self.prefix} {w}" for w in ("yes", "no", "maybe")]
'''


class Move(BaseModel):
    message: str
    metadata: dict = Field(default_factory=dict)


class Pair(BaseModel):
    a: int
    b: int


class Seen(BaseModel):
    done: bool = False
    reward: float | None = None
    metadata: dict = Field(default_factory=dict)
    board: str = ""


def test_a_reply_is_json_fenced_json_or_the_one_required_fields_value():
    assert hub.parse_action('{"message": "hi"}', Move).message == "hi"
    assert hub.parse_action('```json\n{"message": "hi"}\n```', Move).message == "hi"
    assert hub.parse_action("  just text ", Move).message == "just text"
    assert hub.parse_action('{"a": 1, "b": 2}', Pair) == Pair(a=1, b=2)
    with pytest.raises(ValueError, match=r"write a JSON object with \['a', 'b'\]"):
        hub.parse_action("1 2", Pair)
    with pytest.raises(ValueError):
        hub.parse_action('{"a": "x", "b": 2}', Pair)


def test_an_observations_text_is_its_one_field_else_its_json():
    assert hub._text(Seen(board="X.O", reward=1.0, done=True)) == "X.O"
    assert hub._text(Pair(a=1, b=2)) == '{"a": 1, "b": 2}'


@pytest.fixture
def echo(tmp_path, monkeypatch) -> Path:
    """OpenEnv's own echo environment, rendered from its `init` template into tmp_path."""
    from openenv.cli.commands import init

    names = init._create_template_replacements("echo_env")
    init._copy_template_directory("openenv.cli.templates", "openenv_env",
                                  tmp_path / "echo_env", names, "echo_env")
    (tmp_path / "listed.py").write_text(TASKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith(("echo_env", "listed"))]:
        del sys.modules[name]


@needs_openenv
def test_the_packages_echo_environment_runs_in_process(echo):
    rows, source = hub.rows(ECHO, {})
    assert source == f"openenv EchoEnvironment ({hub.INFINITE_ROWS} seeded episodes)"
    env = hub.env_class(ECHO, {})({**rows[0], "seed": 3})
    (opening,) = env.reset()
    assert opening["role"] == "user" and "Echo Env environment ready!" in opening["content"]
    assert "['message'] (or the value alone)" in opening["content"]
    messages, reward, done = env.step("hello")
    assert (reward, done) == (0.5, False) and '"echoed_message": "hello"' in messages[0]["content"]
    assert env.step('{"message": "0123456789abc"}')[1:] == (1.0, False)
    messages, reward, done = env.step('{"text": "x"}')
    assert (reward, done) == (0.0, False)
    assert messages[0]["content"].startswith("Not an action: message: Field required.")


@needs_openenv
def test_a_task_providers_tasks_are_the_rows_and_env_args_its_constructors(echo):
    rows, source = hub.rows("listed:Listed", {"prefix": "tell"})
    assert source == "openenv Listed split train (3 tasks)"
    assert rows[1] == {"question": "tell no", "openenv_reset": {"split": "train", "index": 1}}
    with pytest.raises(HubError, match=r"Listed\(\*\*workload.env_args=\{'size': '3'\}\)"):
        hub.rows("listed:Listed", {"size": "3"})
    with pytest.raises(HubError, match="is not an openenv.core.Environment subclass"):
        hub.env_class("echo_env.models:EchoAction", {})
    with pytest.raises(HubError, match="has no class 'Nope'|has no function 'Nope'"):
        hub.env_class("listed:Nope", {})

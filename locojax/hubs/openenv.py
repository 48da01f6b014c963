"""OpenEnv 0.10 environments in-process (`workload.env=openenv:<module>:<Class>`).

OpenEnv serves an environment over HTTP or WebSocket from a container or a `uv` process, but
the class it serves is a plain Python object: an `openenv.core.Environment` subclass with
`reset(seed, episode_id, **kwargs) -> Observation` and `step(action) -> Observation` (each
observation with `done` and `reward`, the rubric's where the environment has one). LoCoJAX
builds that class in its env worker, one instance per episode, with no server, container or
network:

    Class(**workload.env_args)                          (each episode's own instance)
    reset()      env.reset(seed=row["seed"], episode_id=uid, **row["openenv_reset"])
                 -> the observation as the opening user message, with the action's form
    step(reply)  the reply as the environment's Action (a JSON object, fenced or not; the
                 bare text for an action with one required field) -> env.step(action)
                 -> (the observation as a user message, its reward, its done); a reply that
                 is no valid action gets the validation error as the message, reward 0

The action class is the `Environment[Action, Observation, State]` parameter or `step`'s
annotation. Rows: the environment's own tasks where it is a `TaskProvider` (its first
split's `list_tasks`, each reset with `split` and `index`), else INFINITE_ROWS alike rows
(each episode's draws come from its seed).
"""

from __future__ import annotations

import json
import typing
from typing import Any

from locojax.hubs.errors import HubError
from locojax.rewards.python_fns import RewardFnError, load_fn

EXTRA = "pip install -e '.[openenv]'"
"""How to install the package (the `openenv` extra)."""
INFINITE_ROWS = 1000
"""Rows of an environment that lists no tasks: each one an episode from its own seed."""
IGNORED = frozenset({"done", "reward", "metadata"})
"""Observation fields that are not its text."""


def _base() -> tuple[type, type]:
    """(openenv's Environment, its Action), or a HubError saying how to install OpenEnv."""
    try:  # late: imports fastapi and fastmcp, paid only by runs with an OpenEnv environment
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.types import Action
    except ImportError as err:
        raise HubError(f"workload.env=openenv:... needs openenv 0.10 ({err}); "
                       f"{EXTRA}") from None
    return Environment, Action


def _class(rest: str) -> type:
    """The Environment subclass `rest` (`<module>:<Class>` or `<file.py>:<Class>`) names."""
    environment, _ = _base()
    try:
        cls = load_fn(rest)
    except RewardFnError as e:
        raise HubError(f"workload.env=openenv:{rest}: "
                       f"{str(e).removeprefix(f'reward function {rest!r}: ')}") from None
    if not (isinstance(cls, type) and issubclass(cls, environment)):
        raise HubError(f"workload.env=openenv:{rest}: {getattr(cls, '__name__', cls)} is not "
                       "an openenv.core.Environment subclass")
    return cls


def _action_class(cls: type) -> type:
    """The Action subclass `cls` takes: its Environment[...] parameter or step's hint."""
    environment, action = _base()
    for base in getattr(cls, "__orig_bases__", ()):
        if typing.get_origin(base) is environment and typing.get_args(base):
            got = typing.get_args(base)[0]
            if isinstance(got, type) and issubclass(got, action):
                return got
    hint = typing.get_type_hints(cls.step).get("action")
    if isinstance(hint, type) and issubclass(hint, action) and hint is not action:
        return hint
    raise HubError(f"{cls.__name__}: step(action) names no Action subclass (annotate it, or "
                   "subclass Environment[YourAction, YourObservation, State])")


def code_spec(rest: str) -> str:
    return rest


def _make(cls: type, args: dict[str, str]) -> Any:
    try:
        return cls(**args)
    except TypeError as e:
        raise HubError(f"{cls.__name__}(**workload.env_args={args}): {e}") from None


def rows(rest: str, args: dict[str, str]) -> tuple[list[dict], str]:
    """The environment's tasks as rows (a TaskProvider's first split), else INFINITE_ROWS
    rows of seeded episodes; where they came from."""
    cls = _class(rest)
    _action_class(cls)
    if not callable(getattr(cls, "list_tasks", None)):
        out = [{"question": f"{cls.__name__} #{i}", "openenv_reset": {}}
               for i in range(INFINITE_ROWS)]
        return out, f"openenv {cls.__name__} ({INFINITE_ROWS} seeded episodes)"
    env = _make(cls, args)
    try:
        split = env.list_splits()[0]
        split = split if isinstance(split, str) else dict(split)["name"]
        tasks = env.list_tasks(split)
    except Exception as e:
        raise HubError(f"{cls.__name__}: its task list failed: {type(e).__name__}: {e}") from None
    out = [{"question": json.dumps(task, default=str) if not isinstance(task, str) else task,
            "openenv_reset": {"split": split, "index": i}} for i, task in enumerate(tasks)]
    return out, f"openenv {cls.__name__} split {split} ({len(out)} tasks)"


def env_class(rest: str, args: dict[str, str]) -> type:
    """The episode class of the Environment `rest` names."""
    cls = _class(rest)
    return type(f"OpenEnv_{cls.__name__}", (OpenEnvEpisode,),
                {"cls": cls, "action_cls": _action_class(cls), "args": dict(args)})


def _text(observation: Any) -> str:
    """An observation's text: its one field other than done/reward/metadata, else JSON."""
    fields = {k: v for k, v in observation.model_dump(mode="json").items() if k not in IGNORED}
    if len(fields) == 1:
        (value,) = fields.values()
        return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(fields, ensure_ascii=False)


def parse_action(reply: str, action_cls: type) -> Any:
    """The reply as an `action_cls` (JSON, fenced JSON, or the bare text of its one required
    field); pydantic's ValidationError (or ValueError) when it is none."""
    text = reply.strip()
    if text.startswith("```") and text.endswith("```"):
        text = "\n".join(text.splitlines()[1:-1]).strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = text
    if not isinstance(value, dict):
        required = action_cls.model_json_schema().get("required", [])
        if len(required) != 1:
            raise ValueError(f"write a JSON object with {required}")
        value = {required[0]: text}
    return action_cls.model_validate(value)


def _why(e: ValueError) -> str:
    """A validation error in one line: its first error's field and message."""
    errors = getattr(e, "errors", None)
    if callable(errors) and errors():
        first = errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "the action"
        return f"{where}: {first.get('msg')}"
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


class OpenEnvEpisode:
    """One episode of an OpenEnv Environment, with LoCoJAX's interface (`envs.user_code`)."""

    cls: Any = None
    action_cls: Any = None
    args: dict[str, str] = {}

    def __init__(self, row: dict) -> None:
        self.env = _make(self.cls, self.args)
        self.seed = row.get("seed")
        self.reset_args = dict(row.get("openenv_reset") or {})

    def _form(self) -> str:
        required = self.action_cls.model_json_schema().get("required", [])
        return (f"Reply with your action: a JSON object with the fields {required}"
                + (" (or the value alone)." if len(required) == 1 else "."))

    def reset(self) -> list[dict]:
        observation = self.env.reset(**{"seed": self.seed, **self.reset_args})
        return [{"role": "user", "content": f"{_text(observation)}\n\n{self._form()}"}]

    def step(self, reply: str) -> tuple[list[dict], float | None, bool]:
        try:
            action = parse_action(reply, self.action_cls)
        except ValueError as e:  # pydantic's ValidationError is one
            return [{"role": "user", "content": f"Not an action: {_why(e)}. "
                                                f"{self._form()}"}], 0.0, False
        observation = self.env.step(action)
        reward = observation.reward
        done = bool(observation.done)
        messages = [] if done else [{"role": "user", "content": _text(observation)}]
        return messages, None if reward is None else float(reward), done

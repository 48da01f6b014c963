"""The user's environment class and tools: loading them, and checking what they return.

    "<file.py>:<Class>"          -> load_env_class -> the class (it has a callable `step`)
    "verifiers:<taskset>", ...   -> load_env_class -> a hub's episode class (`locojax.hubs`)
    ("name", "<file.py>:<fn>")   -> load_tools     -> {name: fn}, [schema, ...]
    env.reset() -> opening(...)  -> [{"role": "system" | "user", "content": str}, ...]
    env.step()  -> step_result() -> (messages, reward, done), reward None -> 0.0

Runs in the environment worker, where the user's code is imported. Every broken contract (a
missing file, class or function, a tool without hints, a wrong return type, a non-finite
reward) raises `EnvError` with one line naming the spec: the run stops, exit 2.
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Callable
from typing import Any

import numpy as np

from locojax.envs.errors import EnvError
from locojax.envs.tools import ToolSpecError, tool_schema
from locojax.hubs import HubError, hub_of
from locojax.rewards.python_fns import RewardFnError, load_fn

STEP_ROLES = frozenset({"user", "tool"})
"""Roles of the messages `step` may add."""
OPENING_ROLES = frozenset({"system", "user"})
"""Roles of the messages `reset` may open an episode with."""
EXPECTED = "expected (list[dict], float | None, bool)"

_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60


def _load(spec: str, what: str, kind: str) -> Any:
    """`load_fn`, its one-line error worded for `what` (an environment or a tool) and `kind`
    ("class" or "function")."""
    try:
        return load_fn(spec)
    except RewardFnError as e:
        line = str(e).removeprefix(f"reward function {spec!r}: ")
        line = line.replace("has no function", f"has no {kind}").replace("<function>",
                                                                          f"<{kind}>")
        raise EnvError(f"{what}: {line}") from None


def load_env_class(spec: str, args: dict[str, str] | None = None) -> type:
    """The class `spec` names (a hub's environment, `verifiers:...` or `openenv:...`, built
    with `args`: `locojax.hubs`); EnvError when it cannot be imported or has no `step`."""
    try:
        hub = hub_of(spec)
        if hub is not None:
            return hub[0].env_class(hub[1], dict(args or {}))
    except HubError as e:
        raise EnvError(str(e)) from None
    cls = _load(spec, f"environment {spec!r}", "class")
    if not callable(getattr(cls, "step", None)):
        raise EnvError(f"environment {spec!r}: {getattr(cls, '__name__', cls)} has no step "
                        f"method: write def step(self, reply) -> (messages, reward, done)")
    return cls


def load_tools(tools: tuple[tuple[str, str], ...]) -> tuple[dict[str, Callable], list[dict]]:
    """({name: function}, their schemas in order, each under its configured name)."""
    fns, schemas = {}, []
    for name, spec in tools:
        fn = _load(spec, f"tool {name!r} ({spec})", "function")
        try:
            schema = tool_schema(fn)
        except ToolSpecError as e:
            raise EnvError(f"tool {name!r} ({spec}): {e}") from None
        fns[name] = fn
        schemas.append({**schema, "function": {**schema["function"], "name": name}})
    return fns, schemas


def _messages_problem(messages: object, roles: frozenset[str]) -> str | None:
    if not isinstance(messages, list | tuple):
        return f"the messages are a {type(messages).__name__}"
    for k, m in enumerate(messages):
        if (not isinstance(m, dict) or m.get("role") not in roles
                or not isinstance(m.get("content"), str)):
            kinds = " | ".join(repr(r) for r in sorted(roles))
            return f"message {k} is {_short.repr(m)}, not {{'role': {kinds}, 'content': str}}"
    return None


def _clean(messages: list | tuple) -> list[dict]:
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]


def opening(spec: str, value: object) -> list[dict]:
    """`reset()`'s return, checked: a non-empty list of system/user messages."""
    problem = _messages_problem(value, OPENING_ROLES)
    if problem is None and not value:
        problem = "no message"
    if problem is not None:
        raise EnvError(f"environment {spec}.reset returned {_short.repr(value)}: expected "
                        f"list[dict]: {problem}")
    return _clean(value)  # type: ignore[arg-type]


def _step_problem(value: object) -> str | None:
    if not isinstance(value, tuple | list) or len(value) != 3:
        return "not a tuple of 3"
    messages, reward, done = value
    if (problem := _messages_problem(messages, STEP_ROLES)) is not None:
        return problem
    if reward is not None and (isinstance(reward, bool | np.bool_)
                               or not isinstance(reward, numbers.Real)):
        return f"the reward is a {type(reward).__name__}"
    if reward is not None and not math.isfinite(float(reward)):
        return f"the reward is {reward}"
    if not isinstance(done, bool | np.bool_):
        return f"done is a {type(done).__name__}"
    return None


def step_result(spec: str, value: object) -> tuple[list[dict], float, bool]:
    """`step()`'s return, checked: (messages, finite reward or None -> 0.0, done)."""
    if (problem := _step_problem(value)) is not None:
        raise EnvError(f"environment {spec}.step returned {_short.repr(value)}: {EXPECTED}: "
                        f"{problem}")
    messages, reward, done = value  # type: ignore[misc]
    return _clean(messages), 0.0 if reward is None else float(reward), bool(done)

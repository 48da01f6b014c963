"""Environment worker process: `python -m locojax.envs.env_worker <socket fd>`.

    parent --Load--> import the class and tools --("ok", schemas) | ("user", line)-->
    parent --Open/Step/Tool/Clear--> the user's code, guarded --Answer--> parent
    parent --None or EOF--> exit;   the parent gone (pid watch) --> exit

Holds one environment instance per episode it was given, keyed by episode index; an episode
that ends (done, or its env raised) is dropped. The requests and answers are in `messages`.
It says "ready" before it takes requests. It leads its own process group, so Ctrl-C and a
launcher's SIGTERM reach the parent, which handles them and then closes the socket. It exits
when the parent dies (`rewards.worker.die_with_parent`, by polling the parent pid:
PR_SET_PDEATHSIG fires when the *thread* that started the process ends, and the runner
restarts workers from its pool threads).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from locojax.envs.bounds import sent_text
from locojax.envs.errors import EnvError
from locojax.envs.messages import Clear, Load, Open, Step, Tool
from locojax.envs.tools import tool_result_text
from locojax.envs.user_code import load_env_class, load_tools, opening, step_result
from locojax.rewards.python_fns import first_line
from locojax.rewards.worker import Answer, die_with_parent


@dataclass
class _Held:
    """What the worker holds: the loaded user code and the live environments."""

    load: Load
    cls: type | None
    tools: dict[str, Callable]
    envs: dict[int, Any] = field(default_factory=dict)


def _guarded(fn: Callable[[], Any]) -> Answer:
    """("ok", fn()) or ("error", "<ExcType>: <first line>"): the user's code may raise anything."""
    try:
        return "ok", fn()
    except BaseException as e:  # noqa: BLE001 - the user's code: any failure is counted
        return "error", f"{type(e).__name__}: {first_line(e)}"


def _checked(check: Callable[[], Any]) -> Answer:
    """("ok", check()) or ("user", line) when the user's value broke its contract."""
    try:
        return "ok", check()
    except EnvError as e:
        return "user", str(e)


def _clear(held: _Held, _: Clear) -> Answer:
    held.envs.clear()
    return "ok", None


def _open(held: _Held, msg: Open) -> Answer:
    cls = held.cls
    assert cls is not None, "Open without an environment class"
    held.envs.pop(msg.index, None)
    status, env = _guarded(lambda: cls(msg.row))
    if status != "ok":
        return status, env
    held.envs[msg.index] = env
    if not callable(getattr(env, "reset", None)):
        return "ok", [{"role": "user", "content": str(msg.row["prompt"])}]
    status, value = _guarded(env.reset)
    if status != "ok":
        del held.envs[msg.index]
        return status, value
    return _checked(lambda: opening(held.load.env, value))


def _step(held: _Held, msg: Step) -> Answer:
    env = held.envs.get(msg.index)
    if env is None:
        return "error", f"KeyError: no episode {msg.index} in this worker"
    status, value = _guarded(lambda: env.step(msg.reply))
    answer = _checked(lambda: step_result(held.load.env, value)) if status == "ok" else (
        status, value)
    if answer[0] != "ok" or answer[1][2]:  # failed or done: the episode ends here
        del held.envs[msg.index]
    return answer


def _tool(held: _Held, msg: Tool) -> Answer:
    fn = held.tools[msg.name]  # the parent sends only configured names
    return _guarded(lambda: sent_text(tool_result_text(fn(**msg.arguments)), msg.max_tokens))


HANDLERS: dict[type, Callable[[_Held, Any], Answer]] = {
    Clear: _clear, Open: _open, Step: _step, Tool: _tool}
"""The handler of each request after `Load`."""


def _loaded(load: Load) -> tuple[_Held | None, Answer]:
    try:
        cls = load_env_class(load.env, dict(load.env_args)) if load.env else None
        tools, schemas = load_tools(load.tools)
    except EnvError as e:
        return None, ("user", str(e))
    return _Held(load, cls, tools), ("ok", schemas)


def serve(conn: Connection) -> None:
    """Say "ready", take a `Load`, then answer requests until None or the parent goes away."""
    conn.send("ready")
    try:
        held, answer = _loaded(conn.recv())
        conn.send(answer)
        while held is not None and (msg := conn.recv()) is not None:
            conn.send(HANDLERS[type(msg)](held, msg))
    except (EOFError, OSError):
        pass  # the parent closed the socket or exited


if __name__ == "__main__":
    die_with_parent()  # a group of its own (`worker.spawn`): the trainer's signals stay there
    serve(Connection(int(sys.argv[1])))

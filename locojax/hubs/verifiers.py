"""verifiers 0.4 environments driven by LoCoJAX's replies (`workload.env=verifiers:<taskset>`).

verifiers 0.4 runs an episode as `Env.run(task, agents)`: the environment's code plays the
user between the model's turns through `agents.<seat>.interaction(task)` and its
`turn(message) -> Segment` (or one `agents.<seat>.run(task)`), and each seat is an Agent
whose harness program asks a model server for every reply. LoCoJAX stands in for the one seat
(`_Seat`), so no server and no harness program run:

    Class(row)    the task rebuilt from the row's `vf_task` column (`rows` wrote it)
    reset()       Env.setup + Env.run start on the worker's event loop and run until the seat
                  is asked for its first reply -> the opening (the task's system prompt and
                  prompt, or the first message run() sends)
    step(reply)   the reply answers that turn (recorded in a `vf.Trace`; the task's @stop
                  hooks and the seat's max_turns checked as verifiers checks them); run()
                  goes on until it asks again -> (the messages it sent, None, False), or
                  returns -> Env.finalize, then the score: each trace's Task.score (the
                  @reward functions, sync or async, runtime-less) and what run() and
                  finalize recorded -> ([], reward, True)

The taskset's tasks are the workload's rows (`rows`): the prompt's text as `question`, the
task's `answer` field when it has one, its data as `vf_task`. Supported: environments with
one seat (LoCoJAX plays it; an environment whose other seats are models, such as user-sim,
is refused) and tasks without MCP tool servers (`workload.tools` are LoCoJAX's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import random
import sys
from pathlib import Path
from typing import Any, get_type_hints

from locojax.hubs.errors import HubError

EXTRA = "pip install -e '.[verifiers]'"
"""How to install the package (the `verifiers` extra)."""
INFINITE_ROWS = 1000
"""Tasks taken from a taskset whose `load()` never ends (`Taskset.INFINITE`)."""

_LOOP: asyncio.AbstractEventLoop | None = None
"""The worker's event loop: every episode's coroutine runs on it, one call at a time."""


def _vf() -> Any:
    """`verifiers.v1`, or a HubError saying how to install verifiers 0.4."""
    try:  # late: ~9 CPU-seconds of imports, paid only by runs with a verifiers environment
        import verifiers.v1 as vf
    except ImportError as err:
        raise HubError(f"workload.env=verifiers:... needs verifiers 0.4 ({err}); "
                       f"{EXTRA}") from None
    return vf


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def _taskset_id(rest: str) -> str:
    """The taskset id verifiers resolves (`verifiers.v1.tasksets.<id>`, else module `<id>`);
    a `<file.py>` is imported first as the module named by its stem."""
    if not rest.endswith(".py"):
        return rest
    path = Path(rest).expanduser().resolve()
    if not path.is_file():
        raise HubError(f"workload.env=verifiers:{rest}: no file {path}")
    if path.stem not in sys.modules:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[path.stem]
            raise HubError(f"workload.env=verifiers:{rest}: cannot import it: "
                           f"{_first_line(e)}") from None
    return path.stem


def _env_config(vf: Any, rest: str, args: dict[str, str]) -> Any:
    """The EnvConfig of the taskset `rest` with `args` as its taskset config's fields."""
    taskset = _taskset_id(rest)
    try:
        return vf.resolve_env_config({"taskset": {**args, "id": taskset}})
    except Exception as e:
        errors = getattr(e, "errors", None)
        if callable(errors) and errors():
            first = errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ()))
            raise HubError(f"workload.env=verifiers:{rest}: {where}: {first.get('msg')} "
                           f"(workload.env_args: {args or 'none'})") from None
        raise HubError(f"workload.env=verifiers:{rest}: {_first_line(e)}") from None


def code_spec(rest: str) -> str:
    """The taskset's code for the run's record: the file, verifiers' built-in taskset package
    (found without importing verifiers) or the module `rest` names."""
    if rest.endswith(".py"):
        return f"{rest}:load"
    module = rest.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
    found = importlib.util.find_spec("verifiers")
    for root in (found.submodule_search_locations or []) if found else []:
        builtin = Path(root) / "v1" / "tasksets" / module / "__init__.py"
        if builtin.is_file():
            return f"{builtin}:load"
    return f"{module}:load"


def _row(data: Any) -> dict:
    """A task's row: its prompt's text (or name) as the question, its answer, its data."""
    row = {"question": data.prompt_text or data.name or f"task {data.idx}",
           "vf_task": data.model_dump(mode="json", exclude_none=True)}
    answer = getattr(data, "answer", None)
    if isinstance(answer, str | int | float) and not isinstance(answer, bool):
        row["answer"] = str(answer)
    return row


def rows(rest: str, args: dict[str, str]) -> tuple[list[dict], str]:
    """The taskset's tasks as rows (the first INFINITE_ROWS of an endless one) and where they
    came from; HubError (one line) when it cannot be loaded."""
    vf = _vf()
    config = _env_config(vf, rest, args)
    try:
        taskset = vf.load_taskset(config.taskset)
        view = taskset if taskset.bounded else taskset.take(INFINITE_ROWS)
        out = [_row(task.data) for task in view]
    except HubError:
        raise
    except Exception as e:
        raise HubError(f"workload.env=verifiers:{rest}: its taskset's load() failed: "
                       f"{_first_line(e)}") from None
    return out, f"verifiers taskset {config.taskset.id} ({len(out)} tasks)"


def env_class(rest: str, args: dict[str, str]) -> type:
    """The episode class of the environment `rest` names, its Env built once per process;
    HubError when it has more than one seat or its tasks need MCP tool servers."""
    vf = _vf()
    config = _env_config(vf, rest, args)
    try:
        env = vf.load_environment(config)
    except Exception as e:
        raise HubError(f"workload.env=verifiers:{rest}: cannot build its Env: "
                       f"{_first_line(e)}") from None
    from verifiers.v1.configs.agent import agent_config_fields  # verifiers' own, see _vf

    seats = agent_config_fields(env.config)
    if len(seats) != 1:
        raise HubError(f"workload.env=verifiers:{rest}: {type(env).__name__} has the seats "
                       f"{sorted(seats)}: LoCoJAX plays one (the policy it trains); "
                       "environments whose other seats are models are not supported")
    task_cls = type(env.taskset).task_type()
    if task_cls.toolsets(env.taskset.config.task) or env.taskset.toolsets(env.taskset.config):
        raise HubError(f"workload.env=verifiers:{rest}: its tasks use MCP tool servers, which "
                       "LoCoJAX does not run (its own tools: workload.tools)")
    (name, seat), = seats.items()
    return type(f"Verifiers_{config.taskset.id}", (VerifiersEpisode,),
                 {"env": env, "seat_name": name, "seat_config": seat})


def _loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
    return _LOOP


class VerifiersEpisode:
    """One episode of a verifiers Env, with LoCoJAX's interface (`envs.user_code`)."""

    env: Any = None
    """The verifiers Env (set on the class `env_class` makes)."""
    seat_name: str = "agent"
    seat_config: Any = None

    def __init__(self, row: dict) -> None:
        data = row.get("vf_task")
        if not isinstance(data, dict):
            raise HubError("a row without a vf_task column: a verifiers environment's rows "
                           "are its taskset's (leave workload.data_files empty)")
        task_cls = type(self.env.taskset).task_type()
        task = task_cls(task_cls.data_type().model_validate(data), self.env.taskset.config.task)
        self.seed = row.get("seed")
        self.driver = _Driver(self.env, task, self.seat_name, self.seat_config)

    def reset(self) -> list[dict]:
        random.seed(self.seed)  # an environment drawing from `random` replays per group
        return self.driver.start()

    def step(self, reply: str) -> tuple[list[dict], float | None, bool]:
        return self.driver.step(reply)

    def __del__(self) -> None:
        driver = getattr(self, "driver", None)
        if driver is not None:
            driver.abandon()


def _wire(message: Any) -> dict:
    """A verifiers message as LoCoJAX's {"role", "content"} (text parts only)."""
    from verifiers.v1.types import content_text  # verifiers' own, see _vf

    role = message.role if message.role in ("system", "user", "tool") else "user"
    return {"role": role, "content": content_text(message.content)}


class _Driver:
    """One episode's coroutine, advanced by the worker's `reset` and `step` calls."""

    def __init__(self, env: Any, task: Any, seat_name: str, seat_config: Any) -> None:
        self.env, self.task = env, task
        self.seat_name, self.seat_config = seat_name, seat_config
        self.out: list[dict] = []
        """Messages for the model since its last reply."""
        self.reply: asyncio.Future | None = None
        self.wake: asyncio.Future | None = None
        self.main: asyncio.Task | None = None
        self.reward = 0.0

    async def ask(self, messages: list[dict]) -> str:
        """The model's reply after `messages` (LoCoJAX's next `step`)."""
        self.out.extend(messages)
        self.reply = _loop().create_future()
        self._signal()
        return await self.reply

    def _signal(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    async def _episode(self) -> None:
        vf = _vf()
        try:
            episode = vf.Episode(env=vf.EnvInfo(id=self.env.config.env_id),
                                 task=_trace_task(vf, self.task))
            agents = vf.Agents(self.env.config, lambda name, config: _Seat(
                self, name, config, episode.traces))
            await self.env.setup(agents)
            await self.env.run(self.task, agents)
            await self.env.finalize(self.task, episode)
            self.reward = float(sum(t.reward for t in episode.traces))
        finally:
            self._signal()

    def _advance(self) -> list[dict]:
        """Run the loop until the episode asks for a reply or ends; its new messages."""
        assert self.wake is not None and self.main is not None
        _loop().run_until_complete(self.wake)
        if self.main.done():
            self.main.result()  # the environment's exception: this episode's env_error
        out, self.out = self.out, []
        return out

    def start(self) -> list[dict]:
        loop = _loop()
        self.wake = loop.create_future()
        self.main = loop.create_task(self._episode())
        out = self._advance()
        return out or [{"role": "user", "content": self.task.data.prompt_text or "Begin."}]

    def step(self, reply: str) -> tuple[list[dict], float | None, bool]:
        assert self.main is not None
        if not self.main.done():
            assert self.reply is not None
            self.wake = _loop().create_future()
            self.reply.set_result(reply)
            out = self._advance()
            if not self.main.done():
                return out, None, False
        return [], self.reward, True

    def abandon(self) -> None:
        """Cancel an episode LoCoJAX stopped stepping (its limits cut it, a new batch)."""
        if self.main is None or self.main.done():
            return
        self.main.cancel()
        loop = _loop()
        if not loop.is_running():
            loop.run_until_complete(asyncio.gather(self.main, return_exceptions=True))


def _trace_task(vf: Any, task: Any) -> Any:
    return vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash)


class _Seat:
    """Stands in for a verifiers Agent: LoCoJAX's replies answer its turns."""

    def __init__(self, driver: _Driver, name: str, config: Any, traces: list) -> None:
        self.driver, self.name, self.config, self.traces = driver, name, config, traces
        self.trainable = True

    async def run(self, task: Any, **_: Any) -> Any:
        """One segment on the task's prompt: LoCoJAX's one reply (no harness tools)."""
        async with self.interaction(task) as exchange:
            if task.data.prompt is not None:
                await exchange.turn()
            exchange.trace.stop("agent_completed")
        return exchange.trace

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any):
        exchange = _Exchange(self.driver, task, self)
        try:
            yield exchange
        except BaseException:
            exchange.trace.ok, exchange.trace.is_completed = False, True
            self.traces.append(exchange.trace)
            raise
        await exchange.close()
        self.traces.append(exchange.trace)


def _boundary(fn: Any, vf: Any) -> type:
    """The typed argument a @stop hook judges: vf.Request, vf.Response or vf.Trace."""
    hints = get_type_hints(fn)
    kinds = [hints[p] for p in inspect.signature(fn).parameters if p in hints]
    for kind in (vf.Request, vf.Response):
        if kind in kinds:
            return kind
    return vf.Trace


class _Exchange:
    """An `Interaction` of verifiers' (`turn`, `trace`), its replies LoCoJAX's."""

    def __init__(self, driver: _Driver, task: Any, seat: _Seat) -> None:
        from verifiers.v1.state import state_cls  # verifiers' own, see _vf

        self.vf = vf = _vf()
        self.driver, self.task, self.seat = driver, task, seat
        self.trace = vf.Trace(task=_trace_task(vf, task), state=state_cls(type(task))(),
                              agent=vf.AgentInfo(config=seat.config, name=seat.name))
        self.stops = [(_boundary(fn, vf), fn) for fn in task.hooks("stop")]
        self.started = self.over = False

    def _add(self, message: Any, sampled: bool) -> None:
        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(self.vf.MessageNode(parent=parent, message=message,
                                                    sampled=sampled))

    def _opening(self) -> list:
        vf, data = self.vf, self.task.data
        out = [vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []
        if isinstance(data.prompt, str):
            out.append(vf.UserMessage(content=data.prompt))
        elif data.prompt is not None:
            out.extend(data.prompt)
        return out

    def _given(self, message: Any) -> list:
        from verifiers.v1.dialects import parse_message  # verifiers' own, see _vf

        if message is None:
            return []
        if isinstance(message, str):
            return [self.vf.UserMessage(content=message)]
        return [parse_message(m) if isinstance(m, dict) else m for m in message]

    async def _stopped(self, *kinds: type, response: Any = None) -> str | None:
        """The first @stop hook of `kinds` that fires (its name), or the seat's max_turns."""
        from verifiers.v1.utils.decorators import invoke  # verifiers' own, see _vf

        vf = self.vf
        limit = getattr(self.seat.config, "max_turns", None)
        if vf.Trace in kinds and limit is not None and self.trace.num_turns >= limit:
            return "max_turns"
        given = {vf.Trace: self.trace, vf.Request: vf.Request(messages=self.trace.messages),
                 vf.Response: response}
        for kind, fn in self.stops:
            if kind in kinds:
                got = invoke(fn, given)
                got = await got if inspect.isawaitable(got) else got
                if not isinstance(got, bool):
                    raise TypeError(f"@stop {fn.__name__} returned {type(got).__name__}, "
                                    "not bool")
                if got:
                    return fn.__name__
        return None

    async def turn(self, message: Any = None) -> Any:
        """One user turn (none: a prompted task's opening) and LoCoJAX's reply, as a
        vf.Segment; a terminated one once a limit or @stop ended the exchange."""
        vf = self.vf
        if self.over:
            return vf.Segment(messages=[], terminated=True)
        new = ([] if self.started else self._opening()) + self._given(message)
        self.started = True
        for m in new:
            self._add(m, sampled=False)
        if (stop := await self._stopped(vf.Trace, vf.Request)) is not None:
            self.trace.stop(stop)
            self.over = True
            return vf.Segment(messages=[], terminated=True)
        reply = vf.AssistantMessage(content=await self.driver.ask([_wire(m) for m in new]))
        self._add(reply, sampled=True)
        response = vf.Response(id=self.trace.id, created=0, model="locojax", message=reply,
                               finish_reason="stop")
        if (stop := await self._stopped(vf.Response, response=response)) is not None:
            self.trace.stop(stop)
            self.over = True
        return vf.Segment(messages=[reply])

    async def close(self) -> Any:
        """End the exchange: the trace scored by its task (runtime-less rewards)."""
        if self.trace.stop_condition is None:
            self.trace.stop("user_closed")
        self.trace.is_completed = self.trace.ok = True
        await self.task.score(self.trace)
        return self.trace

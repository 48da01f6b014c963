"""Multi-turn episodes against the user's environment class and tools, run in worker processes.

    EnvSpec --check()--> workers import the class and tools --> tool schemas (spec order)
    rows    --open()---> Class(row).reset() per episode, spread over the workers --> openings
    replies --step() | submit() | submit_each()---> per episode, in its worker (a thread per
                    worker here; submit: on a step thread, the caller going on; submit_each:
                    each episode's own answer, on its worker's thread, `settle`d after):
        tool calls in the reply (and tools configured) -> run each -> tool messages, not done
        no call, an env class                          -> env.step(reply) -> (msgs, reward, done)
        no call, no env class                          -> done (a malformed call: retry)
                    ---> {episode: TurnResult}

The user's code runs on the host that sampled, in `env_worker` processes that cannot take the
run down: a tool or an env that raises is counted (a tool's error goes back to the model as
its result; an env's ends the episode with `env_error`); one past its limit is killed with its
worker, which restarts, and the episodes whose environments it held end with "worker
restarted". Such failures are tallied (`EnvRunner.tallies`), and the training step says each
kind in one warning line (`runtime.hostwork.say_failures`). A wrong return type or
a non-finite reward is the user's bug: `EnvError`, one line naming the class (exit 2).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from locojax.envs.bounds import (
    CHARS_PER_TOKEN,
    CUT_MARK,
    bounded_result,
    capped,
    dropped_message,
)
from locojax.envs.call_formats import FORMATS, ToolFormat
from locojax.envs.errors import EnvError
from locojax.envs.messages import Clear, Load, Open, Step, Tool
from locojax.envs.tools import ToolCall
from locojax.envs.worker import EnvWorker
from locojax.rewards.tally import Tally
from locojax.tokenizers.base import Tokenizer

log = logging.getLogger(__name__)
T = TypeVar("T")

RESTARTED = "worker restarted"
"""The `env_error` of an episode whose environment died with its worker."""
MALFORMED = ('error: malformed tool call: write <tool_call>{"name": <tool name>, '
             '"arguments": {...}}</tool_call>')
"""The tool message answering malformed `<tool_call>` blocks."""


@dataclass(frozen=True)
class EnvSpec:
    """The user's environment and tools, and how they run."""

    env: str
    """"" (no environment class: tools only), `<file.py>:<Class>` / `<module>:<Class>`, or a
    hub's environment (`verifiers:<taskset>`, `openenv:<module>:<Class>`: `locojax.hubs`)."""
    tools: tuple[tuple[str, str], ...]
    """(tool name, `<file.py>:<function>`) pairs; the name is the one the model calls."""
    step_timeout_s: float
    """Limit on one env construction + reset, or one env.step call."""
    tool_timeout_s: float
    """Limit on one tool call."""
    workers: int
    """Worker processes the episodes are spread over."""
    memory_mb: int = 0
    """Each worker's address-space limit in MiB (`workload.reward_memory_mb`; 0: none)."""
    calls: ToolFormat = ToolFormat.qwen
    """How a reply's tool calls are parsed (`envs.call_formats`)."""
    env_args: tuple[tuple[str, str], ...] = ()
    """A hub environment's settings (`workload.env_args`), (name, value) pairs."""
    max_calls: int = 0
    """Tool calls run from one reply (`workload.max_tool_calls`; 0: all; `bounds`)."""
    max_result_tokens: int = 0
    """Tokens of a tool result the model reads (`workload.max_tool_result_tokens`; 0: all)."""

    def __post_init__(self) -> None:
        names = [name for name, _ in self.tools]
        if len(set(names)) != len(names):
            raise EnvError(f"env tools: a name is given twice in {names}")
        for key in ("step_timeout_s", "tool_timeout_s"):
            if not getattr(self, key) > 0:
                raise EnvError(f"env {key}={getattr(self, key)}: give a positive number")
        if self.workers < 1:
            raise EnvError(f"env workers={self.workers}: give at least 1")


@dataclass(frozen=True)
class TurnResult:
    """What one turn of one episode added."""

    messages: tuple[dict, ...]
    """{"role": "user" | "tool", "content": str} messages of the environment or the tools."""
    reward: float
    """This step's reward (0.0 when the env gave None, on tool turns, and on errors)."""
    done: bool
    """The episode ended (always with `env_error`)."""
    tool_calls: int
    """Well-formed calls of configured tools run this turn (raised or timed out included)."""
    tool_errors: int
    """Malformed calls, unknown tool names, tools that raised, timed out or died."""
    env_error: str | None
    """Why the episode ended on an error (env.reset/step raised, timed out, or its worker
    died or restarted), one line; None otherwise."""
    seconds: float
    """Host time spent on this episode's turn (env and tools)."""
    results_cut: int = 0
    """Tool results cut to `EnvSpec.max_result_tokens` (`bounds.bounded_result`)."""
    calls_dropped: int = 0
    """Tool calls of the reply past `EnvSpec.max_calls`, not run."""


def _tool_message(content: str) -> dict:
    return {"role": "tool", "content": content}


class EnvRunner:
    """Episodes of one batch against `spec`'s environment and tools, in worker processes."""

    def __init__(self, spec: EnvSpec, tokenizer: Tokenizer | None = None) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        """Counts the tokens of tool results (None: they are bounded by characters only)."""
        self._names = frozenset(name for name, _ in spec.tools)
        self._workers: list[EnvWorker] = []
        self._threads: ThreadPoolExecutor | None = None
        self._steps: ThreadPoolExecutor | None = None
        """One thread: `submit`'s steps, one after another in submission order."""
        self._lanes: list[ThreadPoolExecutor] = []
        """A thread per worker: `submit_each`'s turns of its episodes, in submission order."""
        self._schemas: list[dict] = []
        self._home: dict[int, int] = {}
        """Open episode -> the worker it runs in."""
        self._born: dict[int, int] = {}
        """Open episode -> the generation of its worker that holds its environment."""
        self._failed: dict[int, str] = {}
        """Open episode -> why it ends at its next step (its reset failed)."""
        self.tallies = (Tally(f"environment {spec.env or '(tools only)'}", "episode turn(s)"),
                        Tally("the tools", "episode turn(s)"))
        """The environment's and the tools' failures since they were last told."""

    def check(self) -> list[dict]:
        """Start the workers, which import the env class and tools; the tools' schemas in
        spec order. EnvError (one line, naming the spec) when the user's code cannot load."""
        if self._workers:
            return list(self._schemas)
        load = Load(self.spec.env, self.spec.tools, self.spec.env_args)
        self._workers = [EnvWorker(load, memory_mb=self.spec.memory_mb)
                         for _ in range(self.spec.workers)]
        self._threads = ThreadPoolExecutor(self.spec.workers, thread_name_prefix="env")
        answers = list(self._threads.map(EnvWorker.start, self._workers))
        bad = next((a for a in answers if a[0] != "ok"), None)
        if bad is not None:
            self.close()
            if bad[0] == "user":
                raise EnvError(bad[1])
            raise RuntimeError(f"environment worker: {bad[1]}")
        self._schemas = answers[0][1]
        return list(self._schemas)

    def _per_worker(self, indices: list[int],
                    fn: Callable[[EnvWorker, list[int]], dict[int, T]]) -> dict[int, T]:
        """fn(worker, its episodes) on every worker at once, the results merged."""
        groups: dict[int, list[int]] = {}
        for i in indices:
            groups.setdefault(self._home[i], []).append(i)
        assert self._threads is not None
        futures = [self._threads.submit(fn, self._workers[w], group)
                   for w, group in groups.items()]
        return {i: r for f in futures for i, r in f.result().items()}

    def open(self, rows: list[dict]) -> list[list[dict]]:
        """Start a batch of episodes, one per row (its columns and "prompt"), dropping the
        previous batch's; each episode's opening messages. Without an env class, or where
        `Class(row)` or `reset()` failed (the episode then ends at its first step), the opening
        is [{"role": "user", "content": row["prompt"]}]."""
        self.check()
        self._home = {i: i % len(self._workers) for i in range(len(rows))}
        self._born, self._failed = {}, {}
        openings = [[{"role": "user", "content": row["prompt"]}] for row in rows]
        if not self.spec.env:
            return openings

        def open_on(worker: EnvWorker, group: list[int]) -> dict[int, list[dict] | str]:
            out: dict[int, list[dict] | str] = {}
            if worker.ask(Clear(), self.spec.step_timeout_s)[0] != "ok":
                log.warning("environment worker: could not clear it; restarted")
            for i in group:
                status, value = worker.ask(Open(i, rows[i]), self.spec.step_timeout_s)
                if status == "user":
                    raise EnvError(value)
                out[i] = value if status == "ok" else f"env.reset: {value}"
                self._born[i] = worker.generation
            return out

        for i, got in self._per_worker(list(self._home), open_on).items():
            if isinstance(got, str):
                self._failed[i] = got
            else:
                openings[i] = got
        self._say_failures(self._failed, "opening")
        return openings

    def step(self, replies: dict[int, str]) -> dict[int, TurnResult]:
        """One turn of each episode in `replies` (episode index -> the model's reply), the
        episodes of each worker in turn, the workers at once. An episode whose result is done
        is closed. EnvError when the env's step broke its contract; ValueError for an episode
        that is not open."""
        self._check_open(replies)

        def step_on(worker: EnvWorker, group: list[int]) -> dict[int, tuple[TurnResult, str]]:
            return {i: self._turn(worker, i, replies[i]) for i in group}

        return self.settle(self._per_worker(sorted(replies), step_on))

    def submit(self, replies: dict[int, str]) -> Future[dict[int, TurnResult]]:
        """`step(replies)` on the runner's step thread, returned at once: the caller's
        thread goes on (the device decodes another wave) while the workers run these
        episodes' turns. Steps submitted run one after another in submission order; the
        future raises what `step` raised."""
        if self._steps is None:
            self._steps = ThreadPoolExecutor(1, thread_name_prefix="env-steps")
        return self._steps.submit(self.step, replies)

    def submit_each(self, replies: dict[int, str]) -> dict[int, Future]:
        """Each episode's turn in its worker, on that worker's own thread (a worker's turns
        one after another in submission order, the workers at once), returned at once:
        episode -> a future of (`TurnResult`, the failure note or ""), which raises what
        `step` raises. Hand the finished ones to `settle`. ValueError for an episode that is
        not open."""
        self._check_open(replies)
        if not self._lanes:
            self._lanes = [ThreadPoolExecutor(1, thread_name_prefix=f"env-{w}")
                           for w in range(len(self._workers))]
        return {i: self._lanes[self._home[i]].submit(
            self._turn, self._workers[self._home[i]], i, reply) for i, reply in replies.items()}

    def _check_open(self, replies: dict[int, str]) -> None:
        closed = sorted(set(replies) - set(self._home))
        if closed:
            raise ValueError(f"episodes {closed} are not open")

    def settle(self, turns: dict[int, tuple[TurnResult, str]]) -> dict[int, TurnResult]:
        """Finished turns (`submit_each`'s, or `step`'s) taken: an episode whose result is
        done is closed, the failures said in one warning line; episode -> its result."""
        for i, (result, _) in turns.items():
            if result.done:
                del self._home[i]
                self._failed.pop(i, None)
        self._say_failures({i: note for i, (_, note) in turns.items() if note}, "a turn")
        return {i: result for i, (result, _) in turns.items()}

    def _say_failures(self, notes: dict[int, str], when: str) -> None:
        """Tally the episodes where the user's code failed, a tool's or the environment's
        (`tallies`: said once a step)."""
        env, tools = self.tallies
        for i in sorted(notes):
            (tools if notes[i].startswith("tool ") else env).add(
                1, f"episode {i} ({when}): {notes[i]}")

    def _turn(self, worker: EnvWorker, i: int, reply: str) -> tuple[TurnResult, str]:
        """Episode i's turn and the first failure of the user's code in it ("" for none)."""
        start = time.monotonic()
        gone = self._failed.get(i) or (RESTARTED if self.spec.env and self._born.get(i)
                                       != worker.generation else None)
        if gone:
            return TurnResult((), 0.0, True, 0, 0, gone, time.monotonic() - start), ""
        calls, malformed = FORMATS[self.spec.calls].parse(reply) if self._names else ([], 0)
        if calls:
            return self._run_tools(worker, calls, malformed, start)
        if self.spec.env:
            return self._env_step(worker, i, reply, malformed, start)
        messages = (_tool_message(MALFORMED),) if malformed else ()
        return TurnResult(messages, 0.0, not malformed, 0, malformed, None,
                          time.monotonic() - start), ""

    def _run_tools(self, worker: EnvWorker, calls: list[ToolCall], malformed: int,
                   start: float) -> tuple[TurnResult, str]:
        """Each call in its turn; with an env class, a call that kills the worker ends the
        episode (its environment is gone)."""
        messages = [_tool_message(MALFORMED)] if malformed else []
        ran, errors, note, cut = 0, malformed, "", 0
        calls, dropped = capped(calls, self.spec.max_calls)
        for call in calls:
            if call.name not in self._names:
                messages.append(_tool_message(f"error: unknown tool {call.name}"))
                errors += 1
                continue
            status, value = worker.ask(Tool(call.name, call.arguments,
                                            self.spec.max_result_tokens), self.spec.tool_timeout_s)
            ran += 1
            if status == "ok":
                value, was_cut = self._bounded(value)
                cut += was_cut
            messages.append(_tool_message(value if status == "ok" else f"error: {value}"))
            if status == "ok":
                continue
            errors += 1
            note = note or f"tool {call.name}: {value}"
            if status in ("timeout", "died") and self.spec.env:
                return TurnResult(tuple(messages), 0.0, True, ran, errors, RESTARTED,
                                  time.monotonic() - start, cut, dropped), note
        if dropped:
            messages.append(_tool_message(dropped_message(dropped, self.spec.max_calls)))
        return TurnResult(tuple(messages), 0.0, False, ran, errors, None,
                          time.monotonic() - start, cut, dropped), note

    def _bounded(self, text: str) -> tuple[str, bool]:
        """A tool's result as the model reads it (`bounds.bounded_result`; without a
        tokenizer, cut to the characters its worker may send)."""
        n = self.spec.max_result_tokens
        if n <= 0:
            return text, False
        if self.tokenizer is not None:
            return bounded_result(text, self.tokenizer, n)
        limit = CHARS_PER_TOKEN * n
        return (text, False) if len(text) <= limit else (
            text[:limit] + CUT_MARK.format(n=n), True)

    def _env_step(self, worker: EnvWorker, i: int, reply: str, malformed: int,
                  start: float) -> tuple[TurnResult, str]:
        status, value = worker.ask(Step(i, reply), self.spec.step_timeout_s)
        if status == "user":
            raise EnvError(value)
        if status != "ok":
            why = f"env.step: {value}"
            return TurnResult((), 0.0, True, 0, malformed, why, time.monotonic() - start), why
        messages, reward, done = value
        assert math.isfinite(reward)  # the worker checked it
        return TurnResult(tuple(messages), reward, done, 0, malformed, None,
                          time.monotonic() - start), ""

    def close(self) -> None:
        """Stop the workers (after the steps submitted); the runner can `check` and `open`
        again."""
        if self._steps is not None:
            self._steps.shutdown()
            self._steps = None
        for lane in self._lanes:
            lane.shutdown()
        self._lanes = []
        for worker in self._workers:
            worker.close()
        self._workers = []
        if self._threads is not None:
            self._threads.shutdown()
            self._threads = None
        self._home, self._born, self._failed = {}, {}, {}

"""Environment hubs: another package's environments as `workload.env`, run by LoCoJAX's engine.

    workload.env = "<hub>:<rest>"  ──hub_of──> (the hub's record, rest)
        record.rows(rest, args)       -> the workload's rows (the data layer, on each host)
        record.env_class(rest, args)  -> a class with LoCoJAX's environment interface,
                                         `Class(row)`, `reset()`, `step(reply)` (env workers)

| hub | rest | its environments |
|---|---|---|
| `verifiers` | a taskset id or module, or `<file.py>` | `hubs.verifiers`: verifiers 0.4 |
| `openenv` | `<module>:<Class>` or `<file.py>:<Class>` | `hubs.openenv`: OpenEnv 0.10, in-process |

`workload.env_args` (strings) configure the hub's environment. A hub's package is an optional
extra; without it, or with an environment it cannot load, `HubError` says so in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from compiler.vocab import EnvHub
from locojax.hubs import openenv, verifiers
from locojax.hubs.errors import HubError

__all__ = ["HUBS", "Hub", "HubError", "code_of", "hub_of", "no_reward"]


@dataclass(frozen=True)
class Hub:
    """One package whose environments LoCoJAX runs."""

    name: EnvHub
    """The prefix of `workload.env` (`verifiers:...`)."""
    rows: Callable[[str, dict[str, str]], tuple[list[dict], str]]
    """(rest, env_args) -> (the workload's rows, where they came from)."""
    env_class: Callable[[str, dict[str, str]], type]
    """(rest, env_args) -> the class an env worker builds each episode from, `Class(row)`."""
    code_spec: Callable[[str], str]
    """rest -> a `<module>:<name>` or `<file.py>:<name>` spec of the code to digest for the
    run's record (`rewards.python_fns.fn_digest`)."""


HUBS: dict[str, Hub] = {hub.name: hub for hub in (
    Hub(EnvHub.verifiers, verifiers.rows, verifiers.env_class, verifiers.code_spec),
    Hub(EnvHub.openenv, openenv.rows, openenv.env_class, openenv.code_spec),
)}
"""The hubs by prefix."""


def hub_of(spec: str) -> tuple[Hub, str] | None:
    """(the hub, the rest of the spec) when `spec` names a hub's environment, else None."""
    prefix, sep, rest = spec.partition(":")
    if not sep or prefix not in HUBS:
        return None
    if not rest:
        raise HubError(f"workload.env={spec}: name the environment after '{prefix}:'")
    return HUBS[prefix], rest


def code_of(spec: str) -> str:
    """The `<module>:<name>` or `<file.py>:<name>` spec whose code `workload.env=spec` runs
    (for the run record's digest): a hub's environment code, else `spec` itself."""
    hub = hub_of(spec)
    return spec if hub is None else hub[0].code_spec(hub[1])


def no_reward(prompts: list, completions: list, **columns: object) -> list[float]:
    """0.0 for every completion: a hub environment's episode reward is its own (its rubric,
    summed into the episode's last step), so the workload's reward function adds nothing."""
    return [0.0] * len(completions)

"""What the runner asks an environment worker, and the answers it gets.

    runner (parent)                          env_worker (child)
    Load(env, tools)          ------------>  import the class and tools  -> ("ok", schemas)
    Clear()                   ------------>  drop every environment       -> ("ok", None)
    Open(index, row)          ------------>  Class(row).reset()           -> ("ok", messages)
    Step(index, reply)        ------------>  env.step(reply)              -> ("ok", (msgs, r, done))
    Tool(name, arguments)     ------------>  fn(**arguments)              -> ("ok", text)
    None                      ------------>  the worker exits

Every request is answered with an `Answer` (`locojax.rewards.worker`): ("ok", value),
("error", "<ExcType>: <first line>") when the user's code raised, ("user", line) when it broke
its contract (a wrong type: the run stops, exit 2); the parent adds ("timeout", why) and
("died", why) when it stopped the worker. Requests live here, not in the worker's main module,
so that both processes unpickle them as the same classes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """Import the environment class and the tools; answers the tools' schemas in order."""

    env: str
    """`<file.py>:<Class>` or `<module>:<Class>`; "" for none."""
    tools: tuple[tuple[str, str], ...]
    """(tool name, `<file.py>:<function>`) pairs."""
    env_args: tuple[tuple[str, str], ...] = ()
    """A hub environment's settings (`workload.env_args`), (name, value) pairs."""


@dataclass(frozen=True)
class Clear:
    """Drop every environment instance the worker holds (a new batch of episodes)."""


@dataclass(frozen=True)
class Open:
    """Make episode `index`'s environment, `Class(row)`, and answer its opening messages."""

    index: int
    row: dict


@dataclass(frozen=True)
class Step:
    """Step episode `index`'s environment with the model's reply."""

    index: int
    reply: str


@dataclass(frozen=True)
class Tool:
    """Call the tool `name` with `arguments`; answers its result as text."""

    name: str
    arguments: dict
    max_tokens: int = 0
    """The result is sent cut to what this many tokens can hold (`bounds.sent_text`; 0: whole)."""

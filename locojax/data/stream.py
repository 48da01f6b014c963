"""Which problems each step and host get: per-epoch shuffles, a pure function of (seed, step).

The stream is an endless sequence of problem indices, epoch e being a permutation of
range(N) seeded by (seed, e). Step s's global batch is positions [s*P, (s+1)*P); a rollout
host takes its [start, stop) slice of it, so N hosts and one controller see the same data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def shard_bounds(n: int, host_index: int, num_hosts: int) -> tuple[int, int]:
    """[lo, hi) of host `host_index`'s contiguous block; sizes differ by at most one."""
    if not 0 <= host_index < num_hosts:
        raise ValueError(f"host_index {host_index} not in [0, {num_hosts})")
    base, extra = divmod(n, num_hosts)
    lo = host_index * base + min(host_index, extra)
    return lo, lo + base + (host_index < extra)


def shard(items: Sequence[T], host_index: int, num_hosts: int) -> list[T]:
    """Host `host_index`'s block of items; the blocks in host order concatenate to all items."""
    lo, hi = shard_bounds(len(items), host_index, num_hosts)
    return [items[i] for i in range(lo, hi)]


@lru_cache(maxsize=4)
def epoch_order(num_problems: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled problem indices of one epoch (cached: a batch rarely spans two epochs)."""
    order = np.random.default_rng([seed, epoch]).permutation(num_problems)
    order.setflags(write=False)
    return order


def indices_at(num_problems: int, seed: int, begin: int, end: int) -> np.ndarray:
    """Problem indices at stream positions [begin, end)."""
    out = np.empty(max(end - begin, 0), dtype=np.int64)
    pos = begin
    while pos < end:
        epoch, offset = divmod(pos, num_problems)
        take = min(end - pos, num_problems - offset)
        out[pos - begin : pos - begin + take] = epoch_order(num_problems, seed, epoch)[
            offset : offset + take
        ]
        pos += take
    return out


@dataclass(frozen=True)
class DataPosition:
    """Where a prompt stream stands: checkpoint it, restore it, and the stream continues exactly."""

    seed: int
    consumed: int = 0
    """Stream positions used so far, over all hosts (step * prompts_per_step)."""

    def to_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "consumed": self.consumed}

    @classmethod
    def from_dict(cls, state: dict[str, int]) -> DataPosition:
        return cls(seed=int(state["seed"]), consumed=int(state["consumed"]))


class PromptStream:
    """Global batches of `prompts_per_step` problem indices, step after step, for every epoch."""

    def __init__(self, num_problems: int, prompts_per_step: int, position: DataPosition) -> None:
        if num_problems < 1 or prompts_per_step < 1:
            raise ValueError(
                f"need problems ({num_problems}) and prompts_per_step ({prompts_per_step})"
            )
        self.num_problems = num_problems
        self.prompts_per_step = prompts_per_step
        self.position = position

    def batch(self, step: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Indices [start, stop) of step's global batch; depends on (seed, step) only."""
        stop = self.prompts_per_step if stop is None else stop
        if not 0 <= start <= stop <= self.prompts_per_step:
            raise ValueError(f"slice [{start}, {stop}) outside a batch of {self.prompts_per_step}")
        first = step * self.prompts_per_step
        return indices_at(self.num_problems, self.position.seed, first + start, first + stop)

    def next(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """This host's [start, stop) of the next global batch; advances the position by a batch."""
        consumed = self.position.consumed
        if consumed % self.prompts_per_step:
            raise ValueError(f"position {consumed} is not a multiple of {self.prompts_per_step}")
        out = self.batch(consumed // self.prompts_per_step, start, stop)
        self.position = DataPosition(self.position.seed, consumed + self.prompts_per_step)
        return out

    @property
    def step(self) -> int:
        """Steps consumed so far."""
        return self.position.consumed // self.prompts_per_step

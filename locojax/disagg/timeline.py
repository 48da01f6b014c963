"""Pure bookkeeping of a DA step: policy lag, stale samples and overlap."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    """Wall-clock [start, end) in seconds since the epoch (one machine's clock)."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        """Length (0 when empty)."""
        return max(self.end - self.start, 0.0)


def span(intervals: list[Interval]) -> Interval:
    """The smallest interval covering all of `intervals` (a phase run by several actors)."""
    return Interval(min(i.start for i in intervals), max(i.end for i in intervals))


def overlap_frac(a: Interval, b: Interval) -> float:
    """Share of the shorter of two phases that ran while the other one ran."""
    shorter = min(a.seconds, b.seconds)
    if shorter <= 0:
        return 0.0
    both = max(min(a.end, b.end) - max(a.start, b.start), 0.0)
    return min(both / shorter, 1.0)


def policy_lag(step: int, version: int) -> int:
    """Updates between the policy that sampled and the one the trainer holds at `step`."""
    return step - version


def stale_hosts(step: int, versions: dict[int, int], max_staleness: int) -> list[int]:
    """Rollout hosts whose samples for `step` lag more than `max_staleness` versions."""
    return sorted(h for h, v in versions.items() if policy_lag(step, v) > max_staleness)


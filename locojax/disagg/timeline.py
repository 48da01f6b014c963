"""Pure bookkeeping of a DA step: policy lag, stale samples, overlap and the metrics row."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from locojax.disagg.actors import STAT_KEYS


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


def reward_row(step: int, stats_HxK: np.ndarray) -> dict:
    """CO's reward and length fields from every rollout host's statistics (hosts x keys)."""
    per_host = dict(zip(STAT_KEYS, stats_HxK.T, strict=True))
    total = {k: float(v.sum()) for k, v in per_host.items()}
    n = max(total["samples"], 1.0)
    mean = total["reward_sum"] / n
    return {
        "step": step,
        "reward_mean": mean,
        "reward_std": float(np.sqrt(max(total["reward_sq_sum"] / n - mean * mean, 0.0))),
        "accuracy": total["correct"] / n,
        "format_rate": total["formatted"] / n,
        "response_len_mean": total["tokens"] / n,
        "prompts_truncated": int(total["truncated"]),
        "tokens": total["tokens"],
        # Hosts roll out in parallel: the phase lasts as long as the slowest one.
        **{k: float(per_host[k].max()) for k in ("rollout_s", "reward_s", "advantage_s")},
        "rollout_s_per_host": [float(x) for x in per_host["rollout_s"]],
    }

"""Per-host episode statistics and the metric fields they make once gathered from every host.

CO all-gathers them over `jax.distributed`; DA's rollout actors return them to the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from locojax.rewards import RewardBatch
from locojax.runtime.hostwork import HostTimes

if TYPE_CHECKING:
    from locojax.runtime.episode import Episode

@dataclass(frozen=True)
class HostStats:
    """One host's statistics of one episode; `as_array()` is the row CO all-gathers and DA's
    rollout actors report (fields in STAT_KEYS order)."""

    reward_sum: float
    reward_sq_sum: float
    correct: float
    formatted: float
    samples: float
    """Samples scored (prompts x group size)."""
    tokens: float
    """Completion tokens."""
    truncated: float
    """Prompts cut to workload.max_prompt_len."""
    rollout_s: float
    reward_s: float
    advantage_s: float
    host_detok_s: float
    host_score_s: float
    host_batch_s: float
    host_samples: float

    @classmethod
    def of(cls, ep: Episode) -> HostStats:
        """The statistics of `ep`."""
        return cls.of_parts(ep.rewards, ep.lengths_B, ep.truncated_prompts, ep.timings, ep.host)

    @classmethod
    def of_parts(cls, r: RewardBatch, lengths_B: np.ndarray, truncated: int, timings: dict,
                 host: HostTimes) -> HostStats:
        """The statistics of scored completions `r` of lengths `lengths_B`."""
        return cls(
            reward_sum=float(r.rewards_B.sum()),
            reward_sq_sum=float((r.rewards_B.astype(np.float64) ** 2).sum()),
            correct=float(r.correct_B.sum()), formatted=float(r.formatted_B.sum()),
            samples=float(len(r.rewards_B)), tokens=float(lengths_B.sum()),
            truncated=float(truncated), rollout_s=float(timings["rollout_s"]),
            reward_s=float(timings["reward_s"]), advantage_s=float(timings["advantage_s"]),
            host_detok_s=float(host.seconds["detok"]), host_score_s=float(host.seconds["score"]),
            host_batch_s=float(host.seconds["batch"]), host_samples=float(host.samples))

    def as_array(self) -> np.ndarray:
        """The fields in STAT_KEYS order (float64)."""
        return np.array([getattr(self, k) for k in STAT_KEYS], np.float64)


STAT_KEYS = tuple(f.name for f in fields(HostStats))
"""The columns of a hosts x keys statistics array (`HostStats` fields, in order)."""


def episode_stats(ep: Episode) -> np.ndarray:
    """One host's statistics of one episode, in STAT_KEYS order (float64)."""
    return HostStats.of(ep).as_array()


def stats_row(r: RewardBatch, lengths_B: np.ndarray, truncated: int, timings: dict,
              host: HostTimes) -> np.ndarray:
    """Statistics of some scored completions (the single controller's driver), in STAT_KEYS
    order (float64)."""
    return HostStats.of_parts(r, lengths_B, truncated, timings, host).as_array()


def reward_fields(step: int, stats_HxK: np.ndarray) -> dict:
    """Reward, length and rollout-phase fields of a metrics row, from every host's stats."""
    per_host = dict(zip(STAT_KEYS, np.asarray(stats_HxK).T, strict=True))
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


def busiest_host(stats_HxK: np.ndarray) -> HostTimes:
    """Host work of the step as its slowest host did it (hosts work in parallel): each kind's
    largest seconds and the largest sample count over the hosts."""
    per_host = dict(zip(STAT_KEYS, np.asarray(stats_HxK).T, strict=True))
    times = HostTimes(samples=int(per_host["host_samples"].max()))
    for kind in ("detok", "score", "batch"):
        times.add(kind, float(per_host[f"host_{kind}_s"].max()))
    return times

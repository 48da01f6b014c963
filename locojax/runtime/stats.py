"""Per-host episode statistics and the metric fields they make once gathered from every host.

CO all-gathers them over `jax.distributed`; DA's rollout actors return them to the driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from locojax.rewards import RewardBatch
from locojax.runtime.hostwork import HostTimes

if TYPE_CHECKING:
    from locojax.runtime.episode import Episode

HOST_STAT_KEYS = ("host_detok_s", "host_score_s", "host_batch_s", "host_samples")
"""Host work each host times for itself (the busiest host's counts in a row)."""
STAT_KEYS = ("reward_sum", "reward_sq_sum", "correct", "formatted", "samples", "tokens",
             "truncated", "rollout_s", "reward_s", "advantage_s", *HOST_STAT_KEYS)
"""What `episode_stats` holds, in order."""


def episode_stats(ep: Episode) -> np.ndarray:
    """One host's statistics of one episode, in STAT_KEYS order (float64)."""
    return stats_row(ep.rewards, ep.lengths_B, ep.truncated_prompts, ep.timings, ep.host)


def stats_row(r: RewardBatch, lengths_B: np.ndarray, truncated: int, timings: dict,
              host: HostTimes) -> np.ndarray:
    """Statistics of some scored completions, in STAT_KEYS order (float64)."""
    return np.array([
        r.rewards_B.sum(), (r.rewards_B.astype(np.float64) ** 2).sum(), r.correct_B.sum(),
        r.formatted_B.sum(), len(r.rewards_B), lengths_B.sum(), truncated,
        timings["rollout_s"], timings["reward_s"], timings["advantage_s"],
        host.seconds["detok"], host.seconds["score"], host.seconds["batch"], host.samples,
    ], np.float64)


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

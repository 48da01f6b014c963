"""Per-host episode statistics and the metric fields they make once gathered from every host.

CO all-gathers them over `jax.distributed`; DA's rollout actors return them to the driver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np

from locojax.rewards import RewardBatch
from locojax.runtime.groups import GroupCounts
from locojax.runtime.hostwork import NO_TURNS, HostTimes, TurnCounts

if TYPE_CHECKING:
    from locojax.runtime.episode import Episode

@dataclass(frozen=True)
class HostStats:
    """One host's statistics of one episode; `as_array()` is the row CO all-gathers and DA's
    rollout actors report (fields in STAT_KEYS order)."""

    reward_sum: float
    reward_sq_sum: float
    correct: float
    """Completions judged correct; NaN when correctness is unknown (`RewardBatch.correct_B`
    None), so that the sum over hosts is NaN too and the row leaves `accuracy` out."""
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
    groups_sampled: float
    """Groups sampled (every batch of dynamic sampling)."""
    groups_zero_std: float
    """Of them, groups whose rewards all agree."""
    groups_padded: float
    """Zero-weight groups in the train rows (dynamic sampling hit its bound)."""
    sample_batches: float
    """Batches sampled (1 without dynamic sampling)."""
    extra_rollout_s: float
    """Generation seconds of the batches after the first."""
    episodes: float = 0.0
    """Multi-turn episodes run (0: single-turn; the turn fields below are then 0)."""
    turns: float = 0.0
    """The model's turns, summed over the episodes."""
    turns_max: float = 0.0
    tool_calls: float = 0.0
    tool_errors: float = 0.0
    """Malformed or unknown calls and tools that raised or timed out."""
    env_errors: float = 0.0
    """Episodes ended by an environment that raised or timed out."""
    tool_results_cut: float = 0.0
    """Tool results cut to workload.max_tool_result_tokens."""
    tool_calls_dropped: float = 0.0
    """Tool calls past workload.max_tool_calls in a reply, not run."""
    env_s: float = 0.0
    """Host seconds in environments and tools."""
    env_wait_s: float = 0.0
    """Seconds the rollout's devices waited between a batch's turns (`Episodes.env_wait_s`)."""
    episodes_truncated: float = 0.0
    """Episodes cut by a limit (a reply's R, max_episode_len, max_turns)."""
    slot_steps: float = 0.0
    """Rows x steps of the episodes' decode loops (`EpisodeCache.slot_steps`)."""
    live_steps: float = 0.0
    """Of those, the steps of rows whose reply was running."""
    masked_env_failures: float = 0.0
    """Episodes given zero loss weight: an environment or worker failure ended them."""
    masked_overlong: float = 0.0
    """Episodes given zero loss weight: a limit cut them (algorithm.overlong=mask)."""
    fn_stats: tuple[float, ...] = field(default=())
    """With reward functions of the user's: (sum, rows scored, rows failed) of each function,
    in `workload.reward_fns` order (FN_STATS columns each, after STAT_KEYS)."""

    @classmethod
    def of(cls, ep: Episode) -> HostStats:
        """The statistics of `ep`."""
        return cls.of_parts(ep.rewards, ep.lengths_B, ep.truncated_prompts, ep.timings, ep.host,
                            ep.groups, ep.turns)

    @classmethod
    def of_parts(cls, r: RewardBatch, lengths_B: np.ndarray, truncated: int, timings: dict,
                 host: HostTimes, groups: GroupCounts,
                 turns: TurnCounts = NO_TURNS) -> HostStats:
        """The statistics of scored completions `r` of lengths `lengths_B` (multi-turn:
        episodes, with their `turns`)."""
        return cls(
            **{f.name: getattr(turns, f.name) for f in fields(TurnCounts)},
            groups_sampled=float(groups.sampled), groups_zero_std=float(groups.zero_std),
            groups_padded=float(groups.padded), sample_batches=float(groups.batches),
            extra_rollout_s=float(groups.extra_rollout_s),
            reward_sum=float(r.rewards_B.sum()),
            reward_sq_sum=float((r.rewards_B.astype(np.float64) ** 2).sum()),
            correct=math.nan if r.correct_B is None else float(r.correct_B.sum()),
            formatted=float(r.formatted_B.sum()),
            samples=float(len(r.rewards_B)), tokens=float(lengths_B.sum()),
            truncated=float(truncated), rollout_s=float(timings["rollout_s"]),
            reward_s=float(timings["reward_s"]), advantage_s=float(timings["advantage_s"]),
            host_detok_s=float(host.seconds["detok"]), host_score_s=float(host.seconds["score"]),
            host_batch_s=float(host.seconds["batch"]), host_samples=float(host.samples),
            fn_stats=tuple(float(x) for name in r.fn_sums for x in (
                r.fn_sums[name], r.fn_counts[name], r.fn_failed[name])))

    def as_array(self) -> np.ndarray:
        """The fields in STAT_KEYS order, then `fn_stats` (float64)."""
        return np.array([*(getattr(self, k) for k in STAT_KEYS), *self.fn_stats], np.float64)


STAT_KEYS = tuple(f.name for f in fields(HostStats) if f.name != "fn_stats")
"""The first columns of a hosts x keys statistics array (`HostStats` fields, in order); the
reward functions' (sum, scored, failed) follow, FN_STATS columns per function."""
FN_STATS = 3
"""Columns per reward function of the user's in a statistics array."""


def _per_host(stats_HxK: np.ndarray) -> dict[str, np.ndarray]:
    return dict(zip(STAT_KEYS, np.asarray(stats_HxK)[:, :len(STAT_KEYS)].T, strict=True))


def fn_fields(stats_HxK: np.ndarray, fn_names: tuple[str, ...]) -> dict:
    """`reward/<name>`: each reward function's mean over the rows it scored (all hosts);
    `reward_fail/<name>`: rows it failed on (timeout or exception, scored 0)."""
    extra = np.asarray(stats_HxK)[:, len(STAT_KEYS):].sum(axis=0)
    if not fn_names or extra.size != FN_STATS * len(fn_names):
        return {}
    row = {}
    for i, name in enumerate(fn_names):
        total, scored, failed = extra[FN_STATS * i:FN_STATS * (i + 1)]
        row[f"reward/{name}"] = float(total / scored) if scored else 0.0
        row[f"reward_fail/{name}"] = int(failed)
    return row


def episode_stats(ep: Episode) -> np.ndarray:
    """One host's statistics of one episode, in STAT_KEYS order (float64)."""
    return HostStats.of(ep).as_array()


def stats_row(r: RewardBatch, lengths_B: np.ndarray, truncated: int, timings: dict,
              host: HostTimes, groups: GroupCounts,
              turns: TurnCounts = NO_TURNS) -> np.ndarray:
    """Statistics of some scored completions (the single controller's driver), in STAT_KEYS
    order (float64)."""
    return HostStats.of_parts(r, lengths_B, truncated, timings, host, groups,
                              turns).as_array()


def turn_fields(total: dict[str, float], per_host: dict[str, np.ndarray]) -> dict:
    """The multi-turn fields of a row (none for single-turn episodes)."""
    episodes = total["episodes"]
    if not episodes:
        return {}
    return {"turns_mean": total["turns"] / episodes, "turns_max": int(per_host["turns_max"].max()),
            "tool_calls": int(total["tool_calls"]), "tool_errors": int(total["tool_errors"]),
            "env_errors": int(total["env_errors"]),
            "tool_results_cut": int(total["tool_results_cut"]),
            "tool_calls_dropped": int(total["tool_calls_dropped"]),
            # Hosts run their environments in parallel: the slowest host's seconds.
            "env_s": float(per_host["env_s"].max()),
            "env_wait_s": float(per_host["env_wait_s"].max()),
            # the share of the rollout the devices waited for environments and tools (what
            # decoding beside them would recover), the most-waiting host's
            "device_idle_frac": float(np.max(per_host["env_wait_s"] / np.maximum(
                per_host["env_wait_s"] + per_host["rollout_s"], 1e-9))),
            # the share of the decode loops' rows x steps that ran a reply (the rest
            # computed rows waiting for an environment, done or empty)
            "slot_busy_frac": total["live_steps"] / max(total["slot_steps"], 1.0),
            "truncated_frac": total["episodes_truncated"] / episodes,
            "masked_env_failures": int(total["masked_env_failures"]),
            "masked_overlong": int(total["masked_overlong"]),
            "episode_len_mean": total["tokens"] / episodes}


def accuracy_field(correct: float, samples: float) -> dict:
    """`accuracy`: the share of completions judged correct; none when correctness is unknown
    (`correct` NaN: a user's reward without `workload.correct` or `correct_threshold`)."""
    return {} if math.isnan(correct) else {"accuracy": correct / max(samples, 1.0)}


def reward_fields(step: int, stats_HxK: np.ndarray, fn_names: tuple[str, ...] = ()) -> dict:
    """Reward, length and rollout-phase fields of a metrics row, from every host's stats
    (with `fn_names`, the reward functions' fields too; `accuracy` only when correctness is
    known)."""
    per_host = _per_host(stats_HxK)
    total = {k: float(v.sum()) for k, v in per_host.items()}
    n = max(total["samples"], 1.0)
    mean = total["reward_sum"] / n
    return {
        "step": step,
        "reward_mean": mean,
        "reward_std": float(np.sqrt(max(total["reward_sq_sum"] / n - mean * mean, 0.0))),
        **accuracy_field(total["correct"], total["samples"]),
        "format_rate": total["formatted"] / n,
        "response_len_mean": total["tokens"] / n,
        "prompts_truncated": int(total["truncated"]),
        "tokens": total["tokens"],
        # Hosts roll out in parallel: the phase lasts as long as the slowest one.
        **{k: float(per_host[k].max()) for k in ("rollout_s", "reward_s", "advantage_s")},
        "rollout_s_per_host": [float(x) for x in per_host["rollout_s"]],
        "samples_per_host": [int(x) for x in per_host["samples"]],
        # Dynamic sampling (runtime.groups); frac_zero_std is TRL's frac_reward_zero_std.
        "frac_zero_std": total["groups_zero_std"] / max(total["groups_sampled"], 1.0),
        "groups_sampled": int(total["groups_sampled"]),
        "groups_padded": int(total["groups_padded"]),
        "sample_batches": int(per_host["sample_batches"].max()),
        "extra_rollout_s": float(per_host["extra_rollout_s"].max()),
        **fn_fields(stats_HxK, fn_names),
        **turn_fields(total, per_host),
    }


def busiest_host(stats_HxK: np.ndarray) -> HostTimes:
    """Host work of the step as its slowest host did it (hosts work in parallel): each kind's
    largest seconds and the largest sample count over the hosts."""
    per_host = _per_host(stats_HxK)
    times = HostTimes(samples=int(per_host["host_samples"].max()))
    for kind in ("detok", "score", "batch"):
        times.add(kind, float(per_host[f"host_{kind}_s"].max()))
    return times

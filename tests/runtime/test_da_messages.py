"""The DA driver <-> actor messages: named statistics in the order CO all-gathers them, and
frozen messages that survive the pickling Ray does."""

import dataclasses
import pickle

import numpy as np
import pytest

from locojax.disagg.messages import EvalDone, RolloutDone, TrainDone, TrainerReady
from locojax.disagg.timeline import Interval
from locojax.runtime.observe.stats import STAT_KEYS, HostStats, busiest_host, reward_fields


def _stats(**given) -> HostStats:
    values = dict.fromkeys(STAT_KEYS, 0.0) | given
    return HostStats(**values)


def test_host_stats_are_the_columns_the_metrics_read():
    assert (*STAT_KEYS, "fn_stats") == tuple(f.name for f in dataclasses.fields(HostStats))
    a = _stats(reward_sum=3.0, reward_sq_sum=5.0, correct=2.0, samples=4.0, tokens=40.0,
               rollout_s=1.5, host_score_s=0.25, host_samples=4.0)
    b = _stats(reward_sum=1.0, reward_sq_sum=1.0, correct=1.0, samples=4.0, tokens=20.0,
               rollout_s=2.5, host_score_s=0.5, host_samples=8.0)
    stats_HxK = np.array([a.as_array(), b.as_array()])
    row = reward_fields(7, stats_HxK)
    assert row["reward_mean"] == 0.5 and row["accuracy"] == 3 / 8
    assert row["response_len_mean"] == 60 / 8
    assert row["rollout_s"] == 2.5 and row["rollout_s_per_host"] == [1.5, 2.5]
    assert row["samples_per_host"] == [4, 4]
    work = busiest_host(stats_HxK).fields()
    assert work["host_score_s"] == 0.5 and work["host_samples"] == 8


def test_group_counts_sum_over_hosts_and_batches_are_the_busiest_hosts():
    a = _stats(groups_sampled=3.0, groups_zero_std=1.0, sample_batches=1.0)
    b = _stats(groups_sampled=6.0, groups_zero_std=3.0, groups_padded=1.0, sample_batches=2.0,
               extra_rollout_s=0.75)
    row = reward_fields(0, np.array([a.as_array(), b.as_array()]))
    assert row["frac_zero_std"] == 4 / 9 and row["groups_sampled"] == 9
    assert (row["groups_padded"], row["sample_batches"], row["extra_rollout_s"]) == (1, 2, 0.75)


def test_reward_function_sums_travel_after_the_stat_keys():
    # Two functions: (sum, scored, failed) each; host a scored 4 rows, host b failed on its 4.
    a = _stats(samples=4.0, fn_stats=(3.0, 4.0, 0.0, 1.0, 2.0, 0.0))
    b = _stats(samples=4.0, fn_stats=(0.0, 0.0, 4.0, 2.0, 4.0, 0.0))
    stats_HxK = np.array([a.as_array(), b.as_array()])
    assert stats_HxK.shape == (2, len(STAT_KEYS) + 6)
    row = reward_fields(0, stats_HxK, ("exact", "overlap"))
    assert row["reward/exact"] == 0.75 and row["reward_fail/exact"] == 4
    assert row["reward/overlap"] == 0.5 and row["reward_fail/overlap"] == 0
    assert busiest_host(stats_HxK).fields()["host_samples"] == 0


def test_messages_are_frozen_and_pickle():
    messages = [
        TrainerReady(start=2, sft_loss=(1.0, 0.5), log=("resumed",)),
        RolloutDone(host=1, step=3, version=2, sampled=Interval(1.0, 2.0),
                    stats=_stats(samples=8.0)),
        TrainDone(metrics={"loss": 0.1}, trained=Interval(2.0, 3.5)),
        EvalDone(sums=(3.0, 3.5, 2.0, 4.0), version=5, seconds=1.5),
    ]
    for m in messages:
        assert pickle.loads(pickle.dumps(m)) == m
        with pytest.raises(dataclasses.FrozenInstanceError):
            m.__setattr__(dataclasses.fields(m)[0].name, None)
    assert messages[1].stats.samples == 8.0 and messages[2].trained.seconds == 1.5

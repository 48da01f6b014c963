"""The cost model's charge for dynamic sampling: expected batches from the zero-std share."""

import dataclasses

import numpy as np
import pytest
from compiler_cases import make_config
from test_cost import layout

from compiler.cost.dynamic import expected_batches, sample_batches
from compiler.cost.estimate import estimate
from compiler.vocab import DynamicSampling


def test_expected_batches_at_the_ends_and_against_a_simulation():
    assert expected_batches(0.0, 12, 10) == 1.0
    assert expected_batches(1.0, 12, 10, hosts=3) == pytest.approx(10.0)
    assert expected_batches(0.5, 12, 1) == 1.0
    rng = np.random.default_rng(0)
    n, p, m, hosts, trials = 4, 0.6, 5, 2, 20_000
    got = []
    for _ in range(trials):
        busiest = 0
        for _h in range(hosts):
            found, k = 0, 0
            while k < m and found < n:
                found += int((rng.random(n) >= p).sum())
                k += 1
            busiest = max(busiest, k)
        got.append(busiest)
    assert expected_batches(p, n, m, hosts) == pytest.approx(np.mean(got), rel=0.02)
    assert expected_batches(p, n, m, hosts + 2) > expected_batches(p, n, m, hosts)


def test_filter_charges_the_rollout_and_its_host_work_not_training():
    base = make_config(mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 1})
    off = estimate(base, layout(1, 1)).co
    algorithm = dataclasses.replace(base.algorithm, dynamic_sampling=DynamicSampling.filter,
                                    zero_std_share=0.6, max_sample_batches=4)
    cfg = dataclasses.replace(base, algorithm=algorithm)
    on = estimate(cfg, layout(1, 1)).co
    e = sample_batches(cfg, 1)
    assert 1 < e <= 4
    assert on.rollout_s == pytest.approx(off.rollout_s * e)
    assert on.score_s == pytest.approx(off.score_s * e, rel=0.01)
    assert on.train_s == off.train_s and on.step_s > off.step_s
    assert ("zero_std_share", 0.6) in [(a.name, a.value) for a in estimate(cfg, layout(1, 1))
                                       .assumptions]
    # Off, or a share of 0: nothing charged.
    assert estimate(dataclasses.replace(cfg, algorithm=dataclasses.replace(
        algorithm, zero_std_share=0.0)), layout(1, 1)).co.rollout_s == off.rollout_s

"""The extra rollout of dynamic sampling (`algorithm.dynamic_sampling=filter`), in batches.

A rollout host samples batches of its n prompts (its share of the step) until it holds n
groups whose rewards differ, or `max_sample_batches` = M batches. With each group zero-std
independently with probability p (`algorithm.zero_std_share`, a run's measured
`frac_zero_std`), a host needs more than k batches when fewer than n of its k n groups are
informative:

    c_k = P(Binomial(k n, 1 - p) < n)            (c_0 = 1)
    E[batches of the busiest of H hosts] = sum_{k=0}^{M-1} (1 - (1 - c_k)^H)

The hosts sample at once and the step waits for the slowest, so the phases a rollout host
repeats per batch (generation, detokenising, scoring) cost this many times one batch's.
"""

from __future__ import annotations

from math import exp, lgamma, log

from compiler.cost.inputs import CostInputs
from compiler.vocab import DynamicSampling


def _fewer_than(n: int, trials: int, q: float) -> float:
    """P(Binomial(trials, q) < n), summed in log space (trials may be thousands)."""
    if q <= 0.0:
        return 1.0
    if q >= 1.0:
        return float(trials < n)
    lq, lp = log(q), log(1.0 - q)
    head = lgamma(trials + 1)
    return min(sum(exp(head - lgamma(j + 1) - lgamma(trials - j + 1) + j * lq
                       + (trials - j) * lp) for j in range(min(n, trials + 1))), 1.0)


def expected_batches(share: float, groups: int, max_batches: int, hosts: int = 1) -> float:
    """Expected batches of the busiest of `hosts` hosts, each wanting `groups` informative
    groups from batches of `groups`, a group zero-std with probability `share`."""
    total = 0.0
    for k in range(max(max_batches, 1)):
        more = 1.0 if k == 0 else _fewer_than(groups, k * groups, 1.0 - share)
        total += 1.0 - (1.0 - more) ** hosts
    return total


def sample_batches(cfg: CostInputs, rollout_hosts: int) -> float:
    """Batches the busiest of `rollout_hosts` samples per step: 1 without dynamic sampling."""
    a = cfg.algorithm
    if a.dynamic_sampling != DynamicSampling.filter or a.zero_std_share <= 0.0:
        return 1.0
    groups = -(-cfg.workload.prompts_per_step // max(rollout_hosts, 1))
    return expected_batches(a.zero_std_share, groups, a.max_sample_batches, rollout_hosts)

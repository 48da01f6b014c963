"""Which sampled groups a host trains on: every mode's dynamic sampling, in numpy.

    batch 0: the host's prompts of the step ──sample, score──> rewards (G per group)
    zero_std: groups whose G rewards all agree (every advantage 0: no signal)
    algorithm.dynamic_sampling=filter: further batches of the host's own prompts
        (`batch_problems`) while it has fewer than n informative groups and has sampled
        fewer than algorithm.max_sample_batches batches (host-local: no host waits on another)
    pick_groups(zero_std, n) ──> the n groups of the train rows: the first n informative ones
        in sampling order, then (bound hit) the first zero-std ones as zero-weight rows
    GroupPool.rows ──> TrainBatch rows of exactly n groups: the plan's batch in every mode

With dynamic_sampling=off the one batch trains whole (zero-std groups included, as before);
the counts (`frac_zero_std`, groups sampled) are kept either way. A CO host and a DA rollout
actor run it through `episode.step_episode`, the single controller's driver per host itself;
the driver never starts JAX, so nothing here makes a JAX array.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from compiler.plan import ExecutionPlan
from compiler.vocab import DynamicSampling
from locojax.data import Problem, PromptStream, Workload
from locojax.data.stream import indices_at
from locojax.runtime.hostwork import Completions, HostWork

EXTRA_SEED_OFFSET = 2_000_003
"""Dynamic sampling's further batches come from a second stream seeded run.seed + this, so
the main stream (each step's own prompts, the supervised warm-up's) is the same either way."""


def batch_problems(workload: Workload, stream: PromptStream, step: int,
                   prompt_range: tuple[int, int], batch: int, batches: int) -> list[Problem]:
    """Batch `batch` of `batches` of a host's problems of `step`: batch 0 is its range of the
    step's prompts (`steps.step_problems`); batch k >= 1 (dynamic sampling) is the host's range of the (step (batches - 1) + k - 1)-th
    batch of the second stream. A function of (seed, step, range, k) alone: resumable, and
    the same whatever the other hosts sampled."""
    start, stop = prompt_range
    if batch == 0:
        order = stream.batch(step, start, stop)
    else:
        first = (step * (batches - 1) + batch - 1) * stream.prompts_per_step
        order = indices_at(stream.num_problems, stream.position.seed + EXTRA_SEED_OFFSET,
                           first + start, first + stop)
    return [workload.train[int(i)] for i in order]


def zero_std(rewards_B: np.ndarray, group: int) -> np.ndarray:
    """bool per group of `group` adjacent rewards: all of them equal."""
    r_PxG = np.asarray(rewards_B).reshape(-1, group)
    return (r_PxG == r_PxG[:, :1]).all(axis=1)


@dataclass(frozen=True)
class GroupPick:
    """The groups of a host's train rows, in sampling order."""

    index_N: np.ndarray
    """int: positions of the groups among every group the host sampled this step."""
    weight_N: np.ndarray
    """bool: False for a zero-weight group (its loss mask cleared)."""


def pick_groups(zero_P: np.ndarray, want: int, filtering: bool) -> GroupPick:
    """`want` of the sampled groups (`zero_P`: which are zero-std, in sampling order).

    Off: the first `want` (the step's own prompts), all trained. Filtering: the first `want`
    informative groups; when there are fewer, the first zero-std groups fill the places left
    with zero weight."""
    zero_P = np.asarray(zero_P, bool)
    if len(zero_P) < want:
        raise ValueError(f"{len(zero_P)} groups sampled, {want} wanted")
    if not filtering:
        return GroupPick(np.arange(want), np.ones(want, bool))
    informative = np.flatnonzero(~zero_P)[:want]
    padding = np.flatnonzero(zero_P)[:want - len(informative)]
    index = np.sort(np.concatenate([informative, padding]))
    return GroupPick(index, ~zero_P[index])


@dataclass(frozen=True)
class GroupCounts:
    """One host's (or the driver's, summed) groups of one step."""

    sampled: int
    """Groups sampled (prompts of every batch)."""
    zero_std: int
    """Of them, groups whose rewards all agree."""
    padded: int
    """Zero-weight groups in the train rows (the bound was hit); 0 when off."""
    batches: int
    """Batches sampled (1 when off)."""
    extra_rollout_s: float
    """Generation seconds of the batches after the first."""

    @classmethod
    def merged(cls, parts: Sequence[GroupCounts]) -> GroupCounts:
        """Several hosts' counts: groups summed; batches and extra seconds of the busiest
        (the hosts sample at once)."""
        return cls(sampled=sum(p.sampled for p in parts), zero_std=sum(p.zero_std for p in parts),
                   padded=sum(p.padded for p in parts), batches=max(p.batches for p in parts),
                   extra_rollout_s=max(p.extra_rollout_s for p in parts))


class GroupPool:
    """The batches one host sampled in one step, until `wanting` says it has enough."""

    def __init__(self, want: int, group: int, filtering: bool, max_batches: int):
        self.want, self.group, self.filtering = want, group, filtering
        self.max_batches = max_batches if filtering else 1
        self.parts: list[Completions] = []
        self.rewards: list[np.ndarray] = []
        self.rollout_s: list[float] = []

    @classmethod
    def of(cls, plan: ExecutionPlan, want: int) -> GroupPool:
        """A pool for `want` groups under the plan's `algorithm.dynamic_sampling`."""
        a = plan.algorithm
        return cls(want, plan.batch.group_size, a.dynamic_sampling == DynamicSampling.filter,
                   a.max_sample_batches)

    def add(self, c: Completions, rewards_B: np.ndarray, rollout_s: float) -> None:
        """One sampled batch: its completions, their rewards and its generation seconds."""
        self.parts.append(c)
        self.rewards.append(np.asarray(rewards_B))
        self.rollout_s.append(float(rollout_s))

    def zero_P(self) -> np.ndarray:
        """Which of the groups sampled so far are zero-std (sampling order)."""
        if not self.rewards:
            return np.zeros(0, bool)
        return zero_std(np.concatenate(self.rewards), self.group)

    @property
    def wanting(self) -> bool:
        """Whether another batch is due: filtering, fewer than `want` informative groups,
        fewer than `max_batches` batches."""
        return (self.filtering and len(self.parts) < self.max_batches
                and int((~self.zero_P()).sum()) < self.want)

    def completions(self) -> Completions:
        """Every row sampled, in sampling order."""
        return Completions.concat(self.parts)

    def rows(self, work: HostWork) -> tuple[dict[str, np.ndarray], GroupCounts]:
        """The train rows of `want` groups (`pick_groups`) and the step's counts."""
        zero_P = self.zero_P()
        pick = pick_groups(zero_P, self.want, self.filtering)
        g = self.group
        rows_B = (pick.index_N[:, None] * g + np.arange(g)).reshape(-1)
        every = self.completions()
        chosen = Completions(**{f.name: getattr(every, f.name)[rows_B]
                                for f in dataclasses.fields(every)})
        rows = work.rows(chosen, np.concatenate(self.rewards)[rows_B])
        if not pick.weight_N.all():
            weight_B = np.repeat(pick.weight_N, g)
            rows["loss_mask_BxL"] = rows["loss_mask_BxL"] & weight_B[:, None]
            rows["advantages_B"] = np.where(weight_B, rows["advantages_B"], np.float32(0))
        counts = GroupCounts(sampled=len(zero_P), zero_std=int(zero_P.sum()),
                             padded=int((~pick.weight_N).sum()), batches=len(self.parts),
                             extra_rollout_s=sum(self.rollout_s[1:]))
        return rows, counts

"""What the DA driver and its actors send each other: frozen, typed messages (Ray pickles them).

    driver ──setup()──────> TrainerActor ──TrainerReady (start step, warm-up, log lines)
    driver ──rollout(s)───> RolloutActor ──RolloutDone (version, interval, HostStats) + rows ref
    driver ──train(s, refs)> TrainerActor ──TrainDone (the trainer's metrics, interval)
    driver ──evaluate(s)──> RolloutActor ──EvalDone (correct, prompts, version)

The rows themselves stay numpy dicts in Ray's object store (the trainer's input format) and
weight slices travel as object refs keyed by `transfer.SliceKey` (source host, slice index).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from locojax.disagg.timeline import Interval
from locojax.runtime.observe.stats import HostStats


@dataclass(frozen=True)
class TrainerReady:
    """A trainer's start (`TrainerActor.setup`)."""

    start: int
    """First RL step to run (0 for a fresh run, else the restored checkpoint's)."""
    sft_loss: tuple[float, float] | None
    """First and last supervised warm-up loss; None when there was none (or on resume)."""
    log: tuple[str, ...]
    """The lines the start logged (resume, fallback or warm-up); the driver prints rank 0's."""


@dataclass(frozen=True)
class RolloutDone:
    """A rollout host's samples of one step (`RolloutActor.rollout`); its rows travel as a
    second object ref beside this one."""

    host: int
    step: int
    version: int
    """Policy version that sampled (the driver drops samples lagging > max_staleness)."""
    sampled: Interval
    """Wall-clock interval of the rollout call (weight swap, sampling, reward, rows)."""
    stats: HostStats


@dataclass(frozen=True)
class TrainDone:
    """One global GRPO update (`TrainerActor.train`)."""

    metrics: Mapping[str, float]
    """The trainer's metrics of the step as `Trainer.train` returns them to every mode (CO's
    loop writes the same mapping into its row): a mapping, not fields, because its keys follow
    the loss options (kl with a reference, rc_weight_mean, dual_clip_frac, ...)."""
    trained: Interval
    """Wall-clock interval of the update (after the rows arrived)."""


@dataclass(frozen=True)
class EvalDone:
    """Held-out evaluation of a rollout host's share of the prompts
    (`RolloutActor.evaluate`)."""

    sums: tuple[float, float, float, float]
    """Sums over its prompts of pass@1, pass@k, maj@k, and the prompts
    (`runtime.evaluation.EvalSamples.sums`)."""
    version: int
    """Policy version evaluated."""
    seconds: float = 0.0
    """Seconds the evaluation took on the actor."""

"""What the single controller's driver and its host workers say to each other (frozen, as DA's
messages are); arrays travel through Ray's object store, only their refs ride in messages.

    driver ──HostWorker.setup()──> WorkerReady (step to start at, weights' source, warm-up loss)
    driver: Prompts ──ray.put──> HostWorker.generate(step, [ref], greedy, batch) ──> Generated
        (execution, fetch and put seconds; the completions' bytes and object ref)
    driver: Generated.completions of every worker ──ray.get──> Completions per host
    driver: each host's rows ──ray.put──> HostWorker.train(step, [ref]) ──> Trained
        (execution, fetch, train and reshard seconds; the global step's metrics)
    driver ──save_now(done) | finish()──> the checkpoint's / the export's directory

A ref travels inside a one-element list so that Ray hands it over unresolved.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerReady:
    """A worker's restored or initialised (and warmed-up) policy."""

    start: int
    """First RL step to run (the checkpoint's after a resume, else 0)."""
    source: str
    """Where the weights came from (`Start.source`)."""
    sft_loss: tuple[float, float] | None
    """First and last supervised warm-up loss; None when there was none."""
    log: tuple[str, ...] = ()
    """The lines the start logged (resume, fallback, warm-up); the driver prints worker 0's."""


@dataclass(frozen=True)
class Generated:
    """One worker's sampling of a step's prompts."""

    exec_s: float
    """Seconds inside the call (the driver's round trip beyond it is dispatch time)."""
    rollout_s: float
    fetch_s: float
    """Seconds to fetch the prompts from the object store."""
    put_s: float
    """Seconds to put the completions into the object store."""
    bytes: int
    """Bytes of the completions."""
    completions: list
    """[object ref of the host's `Completions`]: the driver gathers them."""
    slot_steps: int = 0
    """Multi-turn: the call's decode loops' rows x steps (`EpisodeCache.slot_steps`)."""
    live_steps: int = 0
    """Of those, the steps of rows whose reply was running."""


@dataclass(frozen=True)
class Trained:
    """One worker's share of a global train step and its refreshed rollout weights."""

    exec_s: float
    fetch_s: float
    """Seconds to fetch the rows from the object store."""
    train_s: float
    transfer_s: float
    """Seconds of the on-host reshard to the rollout weights."""
    metrics: Mapping[str, float]
    """The global step's metrics (the same on every worker)."""
    compiles: int = 0
    """XLA programs this worker compiled since its last step's (`observe.compiles`)."""

"""Every PRNG key of a step, derived in one place from (run seed, step, stream, batch, turn).

    StepKeys(seed, step).sampling(host, batch)   a host's b-th batch of the step (its stream
                                                 is the host's index; batch 0: the stream's)
    StepKeys(seed, step).evaluation(block)       held-out evaluation (`EVAL_STREAM`), or
                                                 one block of locojax-eval's prompts
    turn_key(batch_key, turn)                    turn t of a batch's multi-turn episodes

A key depends on nothing else (not the mode, the schedule, the process or the device), so a
re-sampled or resumed step draws the same samples, and CO, DA and the single controller draw
alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax

EVAL_STREAM = 99
"""Key stream of held-out evaluation (host indices are the sampling streams)."""


@dataclass(frozen=True)
class StepKeys:
    """The keys of one step of a run."""

    seed: int
    """`run.seed`."""
    step: int

    def stream(self, stream: int) -> jax.Array:
        """The step's key of `stream` (a host's index, or `EVAL_STREAM`)."""
        return jax.random.fold_in(jax.random.fold_in(jax.random.key(self.seed), self.step),
                                  stream)

    def sampling(self, host: int, batch: int = 0) -> jax.Array:
        """The key of `host`'s `batch`-th batch (dynamic sampling): batch 0 keeps the
        stream's key, so its samples are the same with dynamic sampling on or off."""
        key = self.stream(host)
        return jax.random.fold_in(key, batch) if batch else key

    def evaluation(self, block: int | None = None) -> jax.Array:
        """The key of the step's held-out evaluation; with `block`, of that block of the
        evaluation's prompts (`locojax-eval` samples them a block at a time)."""
        key = self.stream(EVAL_STREAM)
        return key if block is None else jax.random.fold_in(key, block)


def turn_key(key: jax.Array, turn: int) -> jax.Array:
    """The key of turn `turn` of the episodes a batch's `key` samples."""
    return jax.random.fold_in(key, turn)

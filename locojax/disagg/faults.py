"""What a DA run does when an actor dies: errors, the last checkpoint, a kill switch for tests.

A rollout actor is restarted by Ray (as often as it dies), given the current weights and
its prompts again, so no step is lost or repeated; one that dies `ROLLOUT_MAX_RESTARTS` times
in a row, without a rollout it finished between, ends the run. A trainer actor holds the optimizer state
that exists nowhere else: its death ends the run with one line naming the checkpoint to
resume from (rerunning the same command resumes there).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from locojax.runtime.rundir.files import CHECKPOINTS_DIR, step_of

ROLLOUT_MAX_RESTARTS = 3
"""Restarts of one rollout actor in a row (no rollout finished between them) before the run
gives up on it; a rollout it finishes starts the count again, so a long run survives any
number of isolated deaths."""


class TrainerLost(RuntimeError):
    """A trainer actor died; the run stops (its optimizer state is gone)."""


class RolloutLost(RuntimeError):
    """A rollout actor died more often than it may be restarted."""


def last_checkpoint(run_dir: Path) -> int | None:
    """Newest finished checkpoint step on disk (Orbax names step directories by number)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return None
    steps = [s for p in root.iterdir() if p.is_dir() and (s := step_of(p.name)) is not None]
    return max(steps, default=None)


def trainer_lost_message(host: int, step: int, run_dir: Path, cause: BaseException) -> str:
    """One line: what died, when, and where to resume from."""
    ckpt = last_checkpoint(run_dir)
    resume = (f"rerun the same command to resume from the checkpoint of step {ckpt} in "
              f"{Path(run_dir) / CHECKPOINTS_DIR}" if ckpt is not None
              else "no checkpoint was written yet; the run starts over")
    reason = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    return f"trainer actor of host {host} died during step {step} ({reason[:160]}); {resume}"


@dataclass(frozen=True)
class KillActor:
    """Step hook that SIGKILLs the `role` ("rollout" or "trainer") actor of host `host` once
    step `step` is in flight."""

    role: str
    step: int
    host: int

    def __call__(self, step: int, rollout_pids: dict[int, int],
                 trainer_pids: dict[int, int]) -> None:
        if step == self.step:
            pids = trainer_pids if self.role == "trainer" else rollout_pids
            os.kill(pids[self.host], signal.SIGKILL)

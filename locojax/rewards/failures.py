"""When failing reward functions stop the run.

    each function's FnScores on one scored batch (a step's, an evaluation's)
        ──FailureWatch.check──> nothing: no failure, or isolated failures (scored 0, counted
                                in `reward_fail/<name>` and warned by the runner)
                           └──> RewardFnError (one line naming the function, exit 2 at the
                                door): every row of the batch failed, or some row failed in
                                each of `workload.reward_max_fail_steps` consecutive steps

A function that always fails would otherwise train on a reward it never computed while the
run looks healthy, and with several functions the reward's definition would change between
hosts and steps. The error is raised before the step trains, so the last checkpoint stays the
last good state.
"""

from __future__ import annotations

from locojax.rewards.python_fns import RewardFnError
from locojax.rewards.runner import FnScores, RewardFn


class FailureWatch:
    """Each function's run of consecutive training steps with a failure, on one host (a step
    fails when any of its batches does: dynamic sampling's, an evaluation's). Batches outside
    training (no step: `locojax-eval`) count one by one, a clean one ending the run."""

    def __init__(self, max_fail_steps: int) -> None:
        if max_fail_steps < 1:
            raise ValueError(f"max_fail_steps={max_fail_steps} must be >= 1")
        self.max_fail_steps = max_fail_steps
        self.streaks: dict[str, int] = {}
        self.last_failed_step: dict[str, int] = {}

    def _streak(self, name: str, failed: bool, step: int | None) -> int:
        """`name`'s streak after a batch of `step` that `failed` (or not)."""
        streak = self.streaks.get(name, 0)
        if step is None:
            streak = streak + 1 if failed else 0
        elif failed:
            last = self.last_failed_step.get(name)
            streak = streak if last == step else streak + 1 if last == step - 1 else 1
            self.last_failed_step[name] = step
        self.streaks[name] = streak
        return streak

    def check(self, fn: RewardFn, got: FnScores, step: int | None = None) -> None:
        """Count `fn`'s batch of training step `step` (None: outside training); raise
        RewardFnError when it failed on every row, or on some row in each of
        `max_fail_steps` consecutive steps."""
        if not len(got.failed_B):
            return
        streak = self._streak(fn.name, bool(got.failed_B.any()), step)
        unit = "batches" if step is None else "steps"
        if got.failed_B.all():
            reason = "on every row of a batch"
        elif streak >= self.max_fail_steps:
            reason = (f"on {streak} consecutive {unit} (workload.reward_max_fail_steps="
                      f"{self.max_fail_steps})")
        else:
            return
        raise RewardFnError(f"reward function {fn.name} ({fn.spec}) failed {reason}, "
                            f"{got.failure}; stopped before training on a reward it did not "
                            "compute (the last checkpoint is kept)")

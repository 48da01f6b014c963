"""When failing reward functions stop the run.

    each function's FnScores on one scored batch (a step's, an evaluation's)
        ──FailureWatch.check──> nothing: no failure, or isolated failures (scored 0, counted
                                in `reward_fail/<name>` and warned by the runner)
                           └──> RewardFnError (one line naming the function, exit 2 at the
                                door): every row of the batch failed, or some row failed on
                                `workload.reward_max_fail_steps` consecutive batches

A function that always fails would otherwise train on a reward it never computed while the
run looks healthy, and with several functions the reward's definition would change between
hosts and steps. The error is raised before the step trains, so the last checkpoint stays the
last good state.
"""

from __future__ import annotations

from locojax.rewards.python_fns import RewardFnError
from locojax.rewards.runner import FnScores, RewardFn


class FailureWatch:
    """Each function's run of consecutive batches with a failure, on one host."""

    def __init__(self, max_fail_steps: int) -> None:
        if max_fail_steps < 1:
            raise ValueError(f"max_fail_steps={max_fail_steps} must be >= 1")
        self.max_fail_steps = max_fail_steps
        self.streaks: dict[str, int] = {}

    def check(self, fn: RewardFn, got: FnScores) -> None:
        """Count `fn`'s batch; raise RewardFnError when it failed on every row, or on some row
        of `max_fail_steps` consecutive batches."""
        if not len(got.failed_B):
            return
        streak = self.streaks.get(fn.name, 0) + 1 if got.failed_B.any() else 0
        self.streaks[fn.name] = streak
        if got.failed_B.all():
            reason = "on every row of a batch"
        elif streak >= self.max_fail_steps:
            reason = (f"on {streak} consecutive batches (workload.reward_max_fail_steps="
                      f"{self.max_fail_steps})")
        else:
            return
        raise RewardFnError(f"reward function {fn.name} ({fn.spec}) failed {reason}, "
                            f"{got.failure}; stopped before training on a reward it did not "
                            "compute (the last checkpoint is kept)")

"""Every error type of ours that the entry point's door turns into one line, in one place.

User mistakes (exit 2): `UserError` (what the user asked for), `RunDirError` (a run directory
that cannot hold the run), `ResumeRefused` (a run directory this plan cannot continue),
`NoCheckpointRestores` (no saved step restores), `JobError` (hosts that cannot form one run).
A run that failed on its own (exit 1): `NonFinite` (the NaN guard stopped it). This module
imports nothing, so the door and the plan-only entry points can name them without JAX.
"""


class UserError(Exception):
    """A mistake in what the user asked for: printed as one line, exit code 2."""


class RunDirError(RuntimeError):
    """The run directory cannot hold the run; the line names it and what is wrong."""


class ResumeRefused(RuntimeError):
    """A run directory cannot be continued with this plan; the line names the keys."""


class NoCheckpointRestores(RuntimeError):
    """Every saved step of a run fails to restore: one line with each step's reason."""


class JobError(RuntimeError):
    """The hosts of a job cannot form one run; the line says what to change (exit 2)."""


class NonFinite(RuntimeError):
    """A training step produced nan or inf; the run stopped without saving or exporting it."""


class SweepInvalid(BaseException):
    """Jobs of a `-m` sweep whose configuration does not compile, found before any job runs:
    `jobs` holds (the job's overrides, its error); the door prints one line per job, exit 2.
    A BaseException, as Hydra turns a callback's `Exception` into a warning and goes on."""

    def __init__(self, jobs: list[tuple[str, BaseException]], total: int) -> None:
        super().__init__(f"{len(jobs)} of {total} jobs of the sweep do not compile")
        self.jobs = jobs
        self.total = total


class SweepFailed(BaseException):
    """Jobs of a `-m` sweep that failed while the sweep ran (the others' table is written):
    one line, exit 2. A BaseException for the reason `SweepInvalid` is."""


def hosts_named(ids: list[int]) -> str:
    """`host 3` or `hosts 0, 2`: the hosts an error line names."""
    return ("host " if len(ids) == 1 else "hosts ") + ", ".join(map(str, ids))

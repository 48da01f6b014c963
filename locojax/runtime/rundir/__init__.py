"""The run directory: where a run's files live, the checks before a run may use it, and the
Orbax checkpoints in it.

`files` (the names of the files and folders and the plan's atomic write), `preflight`
(a writable directory with room for a checkpoint; a resume only with the recorded
configuration) and `checkpoint` (Orbax saves and restores of the training state, with the
fall-back past a damaged newest step).
"""

"""What the modes share: the step kit and the rooms every mode stands on.

The step kit (this package's own modules): `components` (the plan made into a host: meshes,
model, tokenizer, problems, scorer), `assemble` (the plan's sections made into the pure
code's settings), `episode` (rollout, reward and advantages of one host's problems),
`hostwork` (detokenise, score, batch), `trainer` + `weights` + `guard` (the one trainer of
every mode), `steps` (a step's problems, the evaluation share, the metrics row, the run
summary and its report) and `errors` (every error type the door turns into one line).

Rooms: `process/` (process control: signals and stops, jax.distributed, the job's
environment, Ray start-up), `rundir/` (the run directory: its files, its checks before a run,
Orbax checkpoints), `observe/` (metrics, statistics, progress, plots). The modes (`co`,
`disagg`, `single`) import from here and never from each other.
"""

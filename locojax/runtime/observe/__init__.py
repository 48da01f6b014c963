"""Observability: what a run tells its user while it runs and after.

`stats` (per-host episode statistics and the reward fields they make once gathered),
`metrics` (metrics.jsonl and TensorBoard rows), `progress` (the progress line and the summary
table) and `plots` (reward and timing plots of a run and of sweeps).
"""

"""Process control: how a run's processes start, find each other and stop.

`stop` (SIGTERM / SIGINT: the step in progress finishes and is saved, or one line at once
outside the steps), `distributed` (joining `jax.distributed`, small all-gathers during the
run), `job` (what the environment says about a multi-process job: variables only, no JAX),
`ray_cluster` (the Ray cluster both Ray modes start, always shut down) and `parent` (a
process killed with the one that started it).
"""

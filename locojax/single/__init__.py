"""The single-controller baseline: one driver process, one Ray worker per host."""

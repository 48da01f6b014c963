"""LoCoJAX-DA: rollout and training on disjoint host sets, placed as Ray actors.

`driver.run_da(plan, run_dir)` is the entry point; see the data-flow diagram in driver.py.
"""

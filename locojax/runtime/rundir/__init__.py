"""The run directory: where a run's files live, the checks before a run may use it, what
the run starts from, the Orbax checkpoints and the final export in it.

`files` (the names of the files and folders, the plan's atomic write, whether an export is
whole), `preflight` (a writable directory with room for a checkpoint; a resume only with the
recorded configuration), `provenance` (the first lines of a run: weights, dtypes, data, and
`provenance.json`), `checkpoint` (Orbax saves and restores of the training state, with the
fall-back past a damaged newest step) and `export` (the final policy as a Hugging Face model
directory with its tokenizer and generation config).
"""

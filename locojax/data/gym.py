"""Rows of a `reasoning-gym` task (`workload.reasoning_gym`), generated on every host alike.

    GymSettings(task, size, eval_size, seed) ──reasoning_gym.create_dataset──> rows
        {question, answer, metadata}: `size` train rows from `seed`, `eval_size` eval rows
        from `seed + 1` (the same rows on every host and run)

The rows keep `answer` and `metadata` as columns: the task's own `score_answer` reads them
(`locojax.rewards.reasoning_gym.score`). The package is an optional extra; without it, or
with a task it does not know, one line (`DataError`).
"""

from __future__ import annotations

import difflib

from locojax.data.problem import DataError, GymSettings

EXTRA = "pip install -e '.[reasoning-gym]'"
"""How to install the package (the `reasoning-gym` extra)."""


def gym_module():
    """The `reasoning_gym` package, or a DataError saying how to install it."""
    try:
        import reasoning_gym
    except ImportError as err:
        raise DataError(f"workload.reasoning_gym.task needs the reasoning-gym package "
                        f"({err}); {EXTRA}") from None
    return reasoning_gym


def gym_rows(settings: GymSettings, split: str) -> tuple[list[dict], str]:
    """The task's `split` rows (`train`: `size` from `seed`; `eval`: `eval_size` from
    `seed + 1`) as plain dicts, and where they came from."""
    rg = gym_module()
    known = sorted(rg.factory.DATASETS)
    if settings.task not in known:
        close = difflib.get_close_matches(settings.task, known, n=3)
        raise DataError(f"workload.reasoning_gym.task={settings.task}: not a reasoning-gym task"
                        f" ({'did you mean ' + ', '.join(close) + '; ' if close else ''}"
                        f"{len(known)} tasks: reasoning_gym.factory.DATASETS)")
    size, seed = ((settings.size, settings.seed) if split == "train"
                  else (settings.eval_size, settings.seed + 1))
    data = rg.create_dataset(settings.task, size=size, seed=seed)
    rows = [{"question": e["question"], "answer": str(e["answer"]), "metadata": e["metadata"]}
            for e in data]
    return rows, f"reasoning-gym {settings.task} (seed {seed}, {size} rows)"

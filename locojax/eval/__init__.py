"""`python -m locojax.eval`: pass@1, pass@k and maj@k of a checkpoint on a workload's split.

    python -m locojax.eval +experiment=gsm8k_co model=hf eval.checkpoint=<hf dir> \\
        eval.samples=8 sampling.temperature=1.0
    python -m locojax.eval +experiment=arith_co eval.checkpoint=<run dir> eval.samples=4

Writes `samples.jsonl` (one row per prompt: its completions and scores) and `summary.json`
to `eval.out`, and prints the summary as the last line of stdout (`pass@1`, `pass@<k>`,
`maj@<k>`, `mean_length`, `truncation_rate`).
"""

from __future__ import annotations

import json

import hydra
from omegaconf import DictConfig

from compiler.passes.ranges import ranges
from locojax.config.compose import CONF_DIR, to_config
from locojax.eval.score import evaluate
from locojax.launch.door import door, task


@hydra.main(config_path=str(CONF_DIR), config_name="eval", version_base=None)
@task
def main(raw: DictConfig) -> None:
    """Score the checkpoint and print the summary line."""
    cfg = to_config(raw)
    ranges(cfg)
    print(json.dumps(evaluate(cfg)), flush=True)


def cli() -> None:
    """The `locojax-eval` command (`[project.scripts]`): `main` behind the door."""
    door(main)

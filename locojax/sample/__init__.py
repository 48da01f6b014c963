"""`python -m locojax.sample`: complete one prompt with a checkpoint or random weights.

    python -m locojax.sample model.checkpoint=<hf dir> "prompt='What is 2+3?'" \
        sampling.temperature=0 sampling.max_new_tokens=32
    echo "2+3=" | python -m locojax.sample model=tiny model.tokenizer=char model.vocab=32

Prints the completion text and nothing else on stdout (`output=ids`: the token ids). Hydra
needs quotes around values holding `=`, `:` or `,`; an empty `prompt` reads standard input.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from compiler.passes.ranges import ranges
from locojax.config.compose import CONF_DIR, SampleOutput, to_config
from locojax.launch.door import door, task
from locojax.sample.complete import complete


@hydra.main(config_path=str(CONF_DIR), config_name="sample", version_base=None)
@task
def main(raw: DictConfig) -> None:
    """Print the completion of the prompt."""
    cfg = to_config(raw)
    ranges(cfg)
    ids, tokenizer = complete(cfg)
    if cfg.output == SampleOutput.ids:
        print(" ".join(map(str, ids)))
    else:
        print(tokenizer.decode(ids))


def cli() -> None:
    """The `locojax-sample` command (`[project.scripts]`): `main` behind the door."""
    door(main)


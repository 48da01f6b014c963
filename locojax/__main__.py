"""`python -m locojax +experiment=arith_co`: compose -> compile -> run. Nothing more."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from compiler import compile
from compiler.model_entry import check_family
from locojax.config.compose import CONF_DIR, to_config
from locojax.config.resolve import detected_topology
from locojax.launch.dispatch import launch
from locojax.launch.door import door, task
from locojax.reports.plan_view import print_plan


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
@task
def main(raw: DictConfig) -> None:
    """Compile the composed configuration into a plan and run it in the Hydra run directory."""
    cfg = to_config(raw)
    if not cfg.run.plan_only:
        check_family(cfg.model)  # before the compiler sizes a model nothing can run
    plan = compile(cfg, detected_topology(cfg))
    if cfg.run.plan_only:
        print_plan(plan)
        return
    code = launch(plan, Path(HydraConfig.get().runtime.output_dir))
    if code:
        sys.exit(code)


def cli() -> None:
    """The `locojax` command (`[project.scripts]`): `main` behind the door."""
    door(main)


if __name__ == "__main__":
    cli()

"""`python -m locojax.plan`: compose -> compile -> print the plan, on any laptop.

    python -m locojax.plan +experiment=gsm8k_co mesh=v7x mesh.chips=64
    python -m locojax.plan +experiment=numina_da mesh=v7x mesh.chips=256 format=json
    python -m locojax.plan -m +experiment=gsm8k_da mesh=v7x mesh.chips=8,16,32,64 \
        placement.rollout_fraction=0.25,0.5,0.75
    python -m locojax.plan +experiment=gsm8k_co mesh=v5e mesh.chips=8 aot=true

`aot=true` also compiles the plan's programs with the TPU compiler for the plan's slice
(`locojax.aot.target`; needs the `tpu` extra) and prints its memory, FLOPs and collectives
beside the plan's; a program that does not fit is one line, exit 2.

A configuration the compiler rejects prints one line naming the key, the value and the rule,
and exits 2. A `-m` sweep compiles every job first (`locojax.config.sweep_check`): one line
per invalid job, exit 2, no job run; a job that fails later (aot=true) prints its line, the
sweep goes on, and it exits 2 after writing the others' plans.csv.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from compiler import ExecutionPlan, PlanError, compile_plan, plan_to_json
from compiler.cost.roofline import with_compiled_cost
from locojax.config.compose import CONF_DIR, OutputFormat, PlanAppConfig, to_config
from locojax.config.resolve import detected_topology
from locojax.launch.door import door, task
from locojax.reports.aot_view import aot_json, print_aot
from locojax.reports.plan_sweep import plan_row
from locojax.reports.plan_view import print_plan

if TYPE_CHECKING:  # a type only: locojax.aot loads JAX (see _check_on_tpu)
    from locojax.aot.target import AotReport


@hydra.main(config_path=str(CONF_DIR), config_name="plan", version_base=None)
@task
def main(raw: DictConfig) -> dict | None:
    """Compile the composed configuration and print the plan."""
    cfg = to_config(raw)
    detected = detected_topology(cfg)
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        plan = compile_plan(cfg, detected)
        plan, report = _check_on_tpu(cfg, plan) if cfg.aot else (plan, None)
    except PlanError as err:
        if not multirun:
            raise  # the door prints it
        print(f"error: {err}", file=sys.stderr)  # the sweep goes on
        return None
    if cfg.format == OutputFormat.json:
        print(plan_to_json(plan) if report is None else json.dumps(
            {**json.loads(plan_to_json(plan)), "aot": aot_json(report, plan)}, indent=1))
    elif not multirun:
        print_plan(plan)
        if report is not None:
            print_aot(report, plan)
    return plan_row(plan, list(HydraConfig.get().overrides.task)) if multirun else None


def _check_on_tpu(cfg: PlanAppConfig, plan: ExecutionPlan
                  ) -> tuple[ExecutionPlan, AotReport]:
    """`locojax.aot.target.check_on_tpu`, the plan's cost section then estimated with the
    efficiencies of its compiled programs (`compiler.cost.roofline`). Imported here, as the
    aot room loads JAX and the runtime, which a plan without aot=true never needs."""
    from locojax.aot.target import check_on_tpu

    plan, report = check_on_tpu(cfg, plan, replan=compile_plan)
    return with_compiled_cost(plan, report.programs), report


def cli() -> None:
    """The `locojax-plan` command (`[project.scripts]`): `main` behind the door."""
    door(main)


if __name__ == "__main__":
    cli()

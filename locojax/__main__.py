"""`python -m locojax +experiment=arith_co`: compose -> join -> compile (agreed) -> run.

The same command on every host of a cluster forms one run: each process joins the job before
its first JAX call, compiles the plan from the topology it detects, agrees with the others on
the configuration, the plan and the run directory, and runs its own share. A plan that starts
a local Ray cluster (DA, the single controller) re-executes the command once, with the loopback
bind shim preloaded, before it runs (`locojax.runtime.process.loopback`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from compiler import compile_plan
from compiler.config import MeshKind
from compiler.model_entry import check_training
from locojax.config.compose import CONF_DIR, controller_config, to_config
from locojax.config.resolve import detected_topology
from locojax.launch.agree import agreed_config, agreed_plan
from locojax.launch.dispatch import launch
from locojax.launch.door import door, task
from locojax.launch.join import join
from locojax.reports.plan_view import print_plan
from locojax.runtime.process.loopback import pinned_run_dir, reexec_preloaded
from locojax.runtime.process.ray_cluster import starts_local_cluster
from locojax.runtime.process.stop import install


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
@task
def main(raw: DictConfig) -> None:
    """Compile the composed configuration into a plan and run it in the Hydra run directory."""
    # Joined before anything else: `mesh=auto`'s hardware entry asks JAX for the devices.
    controller = controller_config(raw)
    formation = join(controller, ask_jax=raw.mesh.kind != MeshKind.cpu)
    cfg = agreed_config(lambda: to_config(raw), formation, controller.init_timeout_s)
    if not cfg.run.plan_only:
        check_training(cfg)  # before the compiler sizes a model nothing can run
    plan = agreed_plan(cfg, formation, lambda: compile_plan(cfg, detected_topology(cfg)))
    if cfg.run.plan_only:
        if formation.host_index == 0:
            print_plan(plan)
        return
    hydra_cfg = HydraConfig.get()
    if starts_local_cluster(plan) and hydra_cfg.mode != RunMode.MULTIRUN:
        # Its driver listens on loopback only with the shim preloaded: the one run that starts
        # again (a sweep did before its first job, `locojax.config.sweep_check`).
        reexec_preloaded(pinned_run_dir(sys.orig_argv, hydra_cfg.runtime.output_dir))
    code = launch(plan, Path(hydra_cfg.runtime.output_dir), formation,
                  list(hydra_cfg.overrides.task))
    if code:
        sys.exit(code)


def cli() -> None:
    """The `locojax` command (`[project.scripts]`): `main` behind the door; from here on a
    SIGTERM / SIGINT is one line and exit 143 / 130 (`locojax.runtime.process.stop`). A run
    that starts a local Ray cluster starts once more, after its plan is compiled, with the
    loopback bind shim preloaded, so that its driver listens on loopback only
    (`locojax.runtime.process.loopback`)."""
    install()
    door(main)


if __name__ == "__main__":
    cli()

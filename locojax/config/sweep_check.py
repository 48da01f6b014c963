"""Every job of a `-m` sweep compiled before any job runs (a Hydra callback).

    python -m locojax -m ... | python -m locojax.plan -m ...
        on_multirun_start: the sweep's jobs (Hydra's basic sweeper's expansion of the
        overrides) -> each composed as its job will be -> to_config -> compile_plan
        (-> check_training for a training sweep)
        any job fails  -> SweepInvalid (the door: one line per job, exit 2); no job has run,
                          no sweep directory is made
        a training job starts a local Ray cluster (DA, the single controller)
                       -> the sweep re-executed once with the loopback shim preloaded
                          (`locojax.runtime.process.loopback`), still before any job

Without it, a run sweep whose last job is invalid trains every earlier job (minutes) before it
fails, and a plan sweep drops the invalid job from its table.
"""

from __future__ import annotations

from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from compiler import ExecutionPlan, compile_plan
from compiler.model_entry import check_training
from locojax.config.compose import to_config
from locojax.config.resolve import detected_topology
from locojax.runtime.errors import SweepInvalid
from locojax.runtime.process.loopback import reexec_preloaded
from locojax.runtime.process.ray_cluster import starts_local_cluster


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """Each job's overrides, as Hydra's basic sweeper expands the sweep's (`a=1,2 b=x,y`: the
    cartesian product, in its order)."""
    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()]
    arguments += list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
    loader = GlobalHydra.instance().config_loader()
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(arguments)
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def check_job(config: DictConfig, overrides: list[str], train: bool) -> ExecutionPlan:
    """Compose the job with `overrides` as its launcher will and compile its plan; raises the
    job's error."""
    job = GlobalHydra.instance().config_loader().load_sweep_config(config, overrides)
    with open_dict(job):
        del job["hydra"]
    cfg = to_config(job)
    if train and not cfg.run.plan_only:
        check_training(cfg)
    return compile_plan(cfg, detected_topology(cfg))


class SweepCheck(Callback):
    """Hydra callback: compile every job of the sweep first; `SweepInvalid` if any fails.
    `train`: a training sweep (`python -m locojax -m`), whose models must be runnable too;
    `check`: false for entry points whose jobs are not plans (sample, eval)."""

    def __init__(self, train: bool = True, check: bool = True) -> None:
        self.train, self.check = train, check

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.check:
            return
        jobs = sweep_jobs(config)
        failed: list[tuple[str, BaseException]] = []
        plans: list[ExecutionPlan] = []
        for overrides in jobs:
            try:
                plans.append(check_job(config, overrides, self.train))
            except Exception as err:  # each job's own line, printed by the door
                failed.append((" ".join(overrides), err))
        if failed:
            raise SweepInvalid(failed, len(jobs))
        if self.train and any(starts_local_cluster(p) and not p.run.plan_only for p in plans):
            reexec_preloaded()  # nothing made yet: the same sweep, its drivers on loopback

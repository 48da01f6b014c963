"""Experiment trackers behind `MetricsWriter`: Weights & Biases and MLflow (`run.loggers`).

    launch ──check_loggers(plan)──> one line with the install command for a missing extra
    primary host's MetricsWriter ──open_trackers(plan, run_dir)──> [WandbTracker, MlflowTracker]
        config  -> the tracker run's parameters (the resolved configuration, once)
        row     -> one step of metrics (numbers only)
        close   -> plan.json and the run's plots as artifacts, then the run ends
    <run dir>/trackers.json keeps each tracker's run id: a resume continues the same run.

A tracker that fails mid-run (network, disk) warns once on stderr and is dropped; the run and
the other writers go on.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from compiler import ExecutionPlan
from compiler.config import Logger
from locojax.runtime.errors import UserError
from locojax.runtime.rundir.files import PLAN_FILE, write_atomic
from locojax.runtime.rundir.preflight import record_of

TRACKERS_FILE = "trackers.json"
"""{tracker name: run id} of the run directory's tracker runs."""
WANDB_DIR = "wandb"
MLFLOW_DB = "mlflow.db"
EXTRAS = {Logger.wandb: "wandb", Logger.mlflow: "mlflow"}
"""Tracker -> the module it needs (and the name of the extra that installs it)."""


def check_loggers(plan: ExecutionPlan) -> None:
    """One error line naming the install command when a logger asked for is not installed."""
    for logger in plan.run.loggers:
        module = EXTRAS.get(Logger(logger))
        if module and importlib.util.find_spec(module) is None:
            raise UserError(f"run.loggers: {module} is not installed; pip install "
                            f"'locojax[{module}]' (or drop {module} from run.loggers)")


def _ids(run_dir: Path) -> dict[str, str]:
    path = run_dir / TRACKERS_FILE
    try:
        ids = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):  # damaged: the trackers start new runs
        return {}
    return {k: v for k, v in ids.items() if isinstance(v, str)} if isinstance(ids, dict) else {}


def _keep_id(run_dir: Path, name: str, run_id: str) -> None:
    ids = _ids(run_dir) | {name: run_id}
    write_atomic(run_dir / TRACKERS_FILE, json.dumps(ids, indent=1) + "\n")


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    """The row's finite-or-not numbers (not the step, not lists or strings)."""
    return {k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)}


def _artifacts(run_dir: Path) -> list[Path]:
    return [p for p in [run_dir / PLAN_FILE, *sorted(run_dir.glob("*.png"))] if p.is_file()]


class WandbTracker:
    """A wandb run in `<run dir>/wandb/` (offline by default)."""

    name = "wandb"

    def __init__(self, plan: ExecutionPlan, run_dir: Path, config: dict[str, Any]):
        import wandb  # optional extra: imported only when asked for

        cfg = plan.run.wandb
        run_id = _ids(run_dir).get(self.name) or uuid.uuid4().hex[:8]
        self.run_dir = run_dir
        self.run = wandb.init(project=cfg.project, name=cfg.name or run_dir.name,
                              tags=list(cfg.tags), mode=str(cfg.mode), dir=str(run_dir),
                              id=run_id, resume="allow", config=config, reinit=True)
        _keep_id(run_dir, self.name, run_id)

    def log(self, step: int, row: dict[str, Any]) -> None:
        self.run.log(_numbers(row), step=step)

    def close(self) -> None:
        for path in _artifacts(self.run_dir):
            self.run.save(str(path), base_path=str(self.run_dir), policy="now")
        self.run.finish()


def mlflow_key(key: str) -> str:
    """A metric name MLflow accepts (`pass@4` -> `pass_at_4`)."""
    return key.replace("@", "_at_")


class MlflowTracker:
    """An MLflow run (default store: `sqlite:///<run dir>/mlflow.db`)."""

    name = "mlflow"

    def __init__(self, plan: ExecutionPlan, run_dir: Path, config: dict[str, Any]):
        from mlflow.tracking import MlflowClient  # optional extra: imported only when asked for

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # not its table-creation lines
        cfg = plan.run.mlflow
        uri = cfg.tracking_uri or f"sqlite:///{(run_dir / MLFLOW_DB).resolve()}"
        self.client, self.run_dir = MlflowClient(tracking_uri=uri), run_dir
        run_id = _ids(run_dir).get(self.name)
        if run_id is None:
            exp = self.client.get_experiment_by_name(cfg.experiment)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(
                cfg.experiment, artifact_location=(run_dir / "mlartifacts").resolve().as_uri())
            run_id = self.client.create_run(exp_id, run_name=cfg.run_name or run_dir.name
                                            ).info.run_id
            self._params(run_id, config)
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        _keep_id(run_dir, self.name, run_id)

    def _params(self, run_id: str, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:6000]) for k, v in sorted(config.items())]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 per batch
            self.client.log_batch(run_id, params=params[i:i + 100])

    def log(self, step: int, row: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), v, now, step) for k, v in _numbers(row).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        for path in _artifacts(self.run_dir):
            self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id)


TRACKERS = {Logger.wandb: WandbTracker, Logger.mlflow: MlflowTracker}


class Trackers:
    """The run's trackers; each that fails is reported once and dropped."""

    def __init__(self, plan: ExecutionPlan | None, run_dir: Path):
        self.live: list = []
        if plan is None:
            return
        check_loggers(plan)
        config = record_of(plan)
        for logger in plan.run.loggers:
            cls = TRACKERS.get(Logger(logger))
            if cls is not None:
                self._call(f"{cls.name} (start)", lambda c=cls: self.live.append(
                    c(plan, Path(run_dir), config)))

    def _call(self, what: str, fn, tracker=None) -> None:
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - a tracker never stops the run
            first = (str(err).splitlines() or [type(err).__name__])[0][:200]
            print(f"warning: run.loggers: {what} failed ({type(err).__name__}: {first}); the "
                  "run goes on without it", file=sys.stderr, flush=True)
            if tracker in self.live:
                self.live.remove(tracker)

    def log(self, step: int, row: dict[str, Any]) -> None:
        """One metrics row as step `step` of every tracker."""
        for t in list(self.live):
            self._call(t.name, lambda t=t: t.log(step, row), t)

    def close(self) -> None:
        """Artifacts, then each tracker's run ends (a resume reopens it)."""
        for t in list(self.live):
            self._call(f"{t.name} (close)", t.close, t)
        self.live = []

"""The DA loop: Ray actors for rollout hosts and trainer hosts, bounded-staleness overlap.

    plan.json ──Ray──> TrainerActor per trainer host (one jax.distributed group if several)
                       RolloutActor per rollout host (own model, tokenizer, scorer, stream)
    trainers: restore checkpoint | init + SFT warm-up ──publish version v0──> slices (object
        store) ──plan.transfer.rounds──> rollout hosts assemble the weights
    for step s in [start, run.steps):
        dispatch rollout of steps up to s + max_staleness (queued on each rollout actor; it
            samples its prompt range with the newest weights it holds, swapped in between
            generations only)
        collect rollout s ──lag = s - version that sampled; lag > max_staleness: drop
            (dropped_stale) and sample again; dead actor: Ray restarts it, it gets the current
            weights and samples its prompts again
        rows of every rollout host (object refs) ──> trainers: one global GRPO step
            (decoupled PPO: clipped ratio against the trainer's recomputed pi_old, each token
            weighted by algorithm.rollout_correction of pi_old / pi_behaviour, pi_behaviour the
            sampler's log-probs, so lagged samples are corrected) ──> v s+1
            (Orbax checkpoint every run.checkpoint_every)
        trainers ──publish v s+1──> slices ──rounds (bytes and seconds per round, checked
            against the plan)──> rollout hosts, while they already sample step s+1
        row of step s-1 completed with rollout s's timing ──> metrics.jsonl (`runtime.loop`,
            as in every mode)
    end: HF export (trainer 0), reward plot, Ray shut down (also on errors, Ctrl-C, SIGTERM)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from compiler import ExecutionPlan, plan_to_json
from locojax.disagg.actors import RolloutActor, TrainerActor
from locojax.disagg.faults import (
    ROLLOUT_MAX_RESTARTS,
    RolloutLost,
    TrainerLost,
    trainer_lost_message,
)
from locojax.disagg.messages import EvalDone, RolloutDone, TrainDone, TrainerReady
from locojax.disagg.timeline import Interval, overlap_frac, policy_lag, span, stale_hosts
from locojax.disagg.transfer import TransferReport, deliver, deliver_all
from locojax.runtime.evaluation import eval_fields
from locojax.runtime.loop import Begun, StepDone, run_loop
from locojax.runtime.observe.stats import busiest_host
from locojax.runtime.process.job import coordinator_env, free_port
from locojax.runtime.process.ray_cluster import (
    ACTOR_CPUS,
    actor_env,
    failed_to_start,
    interrupted,
    ray_cluster,
)
from locojax.runtime.process.stop import Interrupted, StopSignals
from locojax.runtime.rundir.files import RAY_DIR
from locojax.runtime.steps import close_run, eval_due


@dataclass
class StepRecord:
    """What the driver knows about one step until its row can be written."""

    step: int
    began: float
    stats_HxK: np.ndarray
    lags: list[int]
    dropped: int
    rollout: Interval
    train: TrainDone
    transfer: TransferReport
    transfer_end: float
    eval_refs: list = field(default_factory=list)
    """Object refs of the rollout actors' `EvalDone` (eval steps only)."""


@dataclass(frozen=True)
class RolloutCall:
    """The two object refs of one `RolloutActor.rollout` call."""

    done: object
    """-> RolloutDone"""
    rows: object
    """-> the host's train rows (numpy dict), handed to the trainers unopened"""


def _pids(actors: dict) -> dict[int, int]:
    """Host -> process id of each actor."""
    return dict(zip(actors, ray.get([a.pid.remote() for a in actors.values()]), strict=True))


RESTART_WAIT_S = 120.0
"""How long a restarting rollout actor may stay unavailable before the run gives up on it."""


def _pid_after_restart(actor) -> int:
    """The actor's pid once Ray has restarted it; a call made while it restarts fails with
    ActorUnavailableError (the actor is not dead), so it is retried until RESTART_WAIT_S."""
    deadline = time.time() + RESTART_WAIT_S
    while True:
        try:
            return ray.get(actor.pid.remote())
        except ActorUnavailableError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


class DADriver:
    """Places the actors, runs the loop and writes the metrics."""

    def __init__(self, plan: ExecutionPlan, run_dir: Path, on_step=None, log=print):
        self.plan, self.run_dir, self.on_step, self.log = plan, run_dir, on_step, log
        self.k = plan.placement.max_staleness
        parts = plan.partitions
        text = plan_to_json(plan)
        port = free_port()
        n_train = len(parts.trainer_hosts)
        trainer_cls = ray.remote(TrainerActor)
        self.trainers = {}
        for rank, h in enumerate(parts.trainer_hosts):
            dist = {} if n_train == 1 else coordinator_env(port, n_train, rank)
            self.trainers[h] = trainer_cls.options(
                num_cpus=ACTOR_CPUS, max_restarts=0, runtime_env=actor_env(plan, dist),
            ).remote(text, h, rank, str(run_dir.absolute()))
        rollout_cls = ray.remote(concurrency_groups={"transfer": 1})(RolloutActor)
        self.rollouts = {h: rollout_cls.options(  # max_restarts -1: bounded in a row, here
            num_cpus=ACTOR_CPUS, max_restarts=-1, runtime_env=actor_env(plan, {}),
        ).remote(text, h) for h in parts.rollout_hosts}
        self.in_a_row = dict.fromkeys(parts.rollout_hosts, 0)
        """Restarts of each rollout actor since its last finished rollout."""
        self.pids, self.trainer_pids = _pids(self.rollouts), _pids(self.trainers)
        self.inflight: dict[int, dict[int, RolloutCall]] = {}
        self.slice_refs: dict = {}
        self.version = -1
        self.restarts = 0
        self.step_now = 0
        self.pending: StepRecord | None = None
        """The step trained last, whose row waits for the rollout overlapping it."""

    # -- trainers ---------------------------------------------------------------------------
    def _trainers(self, method: str, *args) -> list:
        """Call `method` on every trainer (collective when several) and wait for all."""
        refs = {h: getattr(a, method).remote(*args) for h, a in self.trainers.items()}
        out = []
        for h, ref in refs.items():
            try:
                out.append(ray.get(ref))
            except RayActorError as err:
                raise TrainerLost(trainer_lost_message(h, self.step_now, self.run_dir, err)) from err
        return out

    def _publish(self, version: int) -> TransferReport:
        """Trainers cut slices of `version`; the plan's rounds deliver them."""
        refs = {}
        for part in self._trainers("publish", version):
            refs.update(part)
        self.slice_refs, self.version = refs, version
        report = deliver(self.plan.transfer, version, refs, self.rollouts)
        for h in report.failed_hosts:
            self._recover(h)
        return report

    # -- rollouts ---------------------------------------------------------------------------
    def _dispatch(self, step: int, hosts=None) -> None:
        calls = self.inflight.setdefault(step, {})
        for h in hosts or self.rollouts:
            calls[h] = RolloutCall(*self.rollouts[h].rollout.remote(step))

    def _recover(self, host: int) -> None:
        """A rollout actor died: wait for Ray's restart, give it the weights, resample."""
        self.restarts += 1
        self.in_a_row[host] += 1
        lost = (f"rollout actor of host {host} died more than {ROLLOUT_MAX_RESTARTS} times in "
                "a row (no rollout finished between)")
        if self.in_a_row[host] > ROLLOUT_MAX_RESTARTS:
            raise RolloutLost(lost)
        try:
            self.pids[host] = _pid_after_restart(self.rollouts[host])
            deliver_all(self.plan.transfer, self.version, self.slice_refs, self.rollouts[host])
        except RayActorError as err:
            raise RolloutLost(lost) from err
        self.log(f"rollout host {host} restarted (pid {self.pids[host]}); its in-flight "
                 f"steps {sorted(self.inflight)} are sampled again")
        for step in sorted(self.inflight):
            self._dispatch(step, [host])

    def _collect(self, step: int) -> tuple[dict[int, RolloutDone], dict[int, object], int]:
        """(RolloutDone, rows ref) per host for `step` and the samples dropped as stale, after
        restarts and stale resampling."""
        dones: dict[int, RolloutDone] = {}
        dropped = 0
        for _ in range(4 * (ROLLOUT_MAX_RESTARTS + 1)):
            for h, call in list(self.inflight[step].items()):
                if h in dones:
                    continue
                try:
                    dones[h] = ray.get(call.done)
                    self.in_a_row[h] = 0
                except RayActorError:
                    self._recover(h)
            for h in stale_hosts(step, {h: d.version for h, d in dones.items()}, self.k):
                dropped += int(dones.pop(h).stats.samples)
                self._dispatch(step, [h])
            if len(dones) == len(self.rollouts):
                calls = self.inflight.pop(step)
                return dones, {h: calls[h].rows for h in sorted(calls)}, dropped
        raise RolloutLost(f"step {step}: rollouts kept failing or lagging")

    # -- runtime.loop.Mode ------------------------------------------------------------------
    progress_keys = {"overlap": "overlap_frac", "lag": "policy_lag_max"}

    def begin(self, log) -> Begun:
        """The trainers restore or initialise; the first one's lines are the run's; version
        `start` goes to the rollout hosts."""
        ready: TrainerReady = self._trainers("setup")[0]
        for line in ready.log:  # the first trainer's start: resume, fallback or warm-up
            log(line)
        self._publish(ready.start)
        return Begun(ready.start, ready.sft_loss)

    def step(self, step: int, stop: StopSignals, emit: Callable[[StepDone], None]
             ) -> int | None:
        """Dispatch rollouts up to `step` + max_staleness, collect `step`'s, emit the step
        before (its row waited for this step's rollout), train, publish. The driver is the
        one process the signal reaches: its flag is the vote."""
        plan, steps = self.plan, self.plan.run.steps
        self.step_now, t0 = step, time.time()
        for ahead in range(step, min(step + self.k, steps - 1) + 1):
            if ahead not in self.inflight:
                self._dispatch(ahead)
        if self.on_step is not None:
            self.on_step(step, dict(self.pids), dict(self.trainer_pids))
        dones, rows, dropped = self._collect(step)
        if self.pending is not None:  # written before this step's training can fail
            emit(self._done(self.pending, dones, t0))
            self.pending = None
        train: TrainDone = self._trainers("train", step, [rows[h] for h in sorted(rows)])[0]
        report = self._publish(step + 1)
        hosts = sorted(dones)
        self.pending = StepRecord(
            step=step, began=t0, stats_HxK=np.array([dones[h].stats.as_array() for h in hosts]),
            lags=[policy_lag(step, dones[h].version) for h in hosts],
            dropped=dropped, rollout=span([d.sampled for d in dones.values()]),
            train=train, transfer=report, transfer_end=time.time())
        if eval_due(step, steps, plan.run.eval_every):
            self.pending.eval_refs = [a.evaluate.remote(step) for a in self.rollouts.values()]
        return int(stop.flag) or None

    def drain(self) -> list[StepDone]:
        rec, self.pending = self.pending, None
        return [] if rec is None else [self._done(rec, None, time.time())]

    def vote(self, flag: float) -> int | None:
        return int(flag) or None

    def evaluate(self, done: StepDone) -> dict[str, float]:
        """The rollout actors' evaluation of `done`'s step, started right after its training
        (it overlapped the next step)."""
        res: list[EvalDone] = ray.get(done.pending)
        fields = eval_fields(np.sum([r.sums for r in res], axis=0), self.plan.run.eval_samples)
        return fields | {"eval_s": max(r.seconds for r in res)}

    def save_now(self, done: int) -> Path:
        return Path(self._trainers("save_now", done)[0])

    def finish(self) -> Path | None:
        export = self._trainers("finish")[0]
        return None if export is None else Path(export)

    def _done(self, rec: StepRecord, next_dones: dict[int, RolloutDone] | None,
              now: float) -> StepDone:
        """`rec`'s step, now that the rollout overlapping its training is known."""
        step_s = now - rec.began
        nxt = span([d.sampled for d in next_dones.values()]) if next_dones else None
        trained = rec.train.trained
        hidden_until = max(trained.end, nxt.end) if nxt else rec.transfer_end
        transfer_s = rec.transfer.seconds
        times = {
            **busiest_host(rec.stats_HxK).fields(),
            "train_s": trained.seconds,
            "transfer_s": transfer_s,
            "exposed_transfer_s": min(max(rec.transfer_end - hidden_until, 0.0), transfer_s)
            if nxt else transfer_s,
            "transfer_bytes": rec.transfer.bytes,
            "transfer_round_s": list(rec.transfer.round_s),
            "transfer_round_bytes": list(rec.transfer.round_bytes),
            "step_s": step_s,
            "rollout_idle_s": max(step_s - (nxt or rec.rollout).seconds, 0.0),
            "trainer_idle_s": max(step_s - trained.seconds, 0.0),
            "overlap_frac": overlap_frac(trained, nxt) if nxt else 0.0,
            "policy_lag_mean": float(np.mean(rec.lags)),
            "policy_lag_max": int(max(rec.lags)),
            "dropped_stale": rec.dropped,
            "rollout_restarts": self.restarts,
            "policy_version": rec.step + 1,
        }
        return StepDone(rec.step, rec.began, rec.stats_HxK, rec.train.metrics, times,
                        pending=rec.eval_refs)


def run_da(plan: ExecutionPlan, run_dir: Path, on_step=None, log=print) -> int:
    """Run a disaggregated plan on a local (or LOCOJAX_RAY_ADDRESS) Ray cluster; exit code."""
    run_dir = Path(run_dir)
    parts = plan.partitions
    actors = len(parts.rollout_hosts) + len(parts.trainer_hosts)
    try:
        with ray_cluster(run_dir / RAY_DIR, actors, log):
            driver = DADriver(plan, run_dir, on_step, log)
            summary = run_loop(driver, plan, run_dir, log=log)
    except (TrainerLost, RolloutLost) as err:
        if failed_to_start(err.__cause__):
            raise err.__cause__ from None  # a setup error (the entry point's door names it)
        print(f"error: {err}", file=sys.stderr)
        return 1
    except Interrupted:
        raise  # Ray is shut down; the door says the line, exit 128 + the signal
    except KeyboardInterrupt:
        return interrupted()
    if driver.restarts:
        log(f"rollout actors restarted by Ray during the run: {driver.restarts}")
    close_run(summary, run_dir, f"{plan.workload.name} on {plan.model.config.name} (DA)",
              "LoCoJAX run (DA)")
    return 0

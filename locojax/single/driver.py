"""The single controller: one driver process that owns no devices, one Ray worker per host.

    plan.json ──Ray──> HostWorker per host (its devices; all of them one jax.distributed group)
    workers: Trainer.start (restore | init + SFT warm-up), rollout weights
    for step in [start, run.steps):
        driver: the step's prompts (one stream), encoded per host ──ray.put──> workers
        every worker: generate (CO's per-host key) ──ray.put──> completions
        driver: gather every host's completions ──> detokenise, score (a pool the size of
            this host's cores), group advantages, train rows (the same `HostWork` as CO's;
            dynamic sampling: further batches on the workers still short, `runtime.groups`)
        driver: each host's rows ──ray.put──> workers: one global GRPO step (the Trainer),
            Orbax save every checkpoint_every, refreshed rollout weights
        driver: metrics.jsonl row with the host cost of each kind (dispatch round trips,
            gather and scatter bytes and seconds, detokenise, score, batch)
        SIGTERM / SIGINT: the step finishes, every worker saves it, exit 143 / 130 in one line;
            the same command resumes there (the loop is `runtime.loop`'s, as in every mode)
    end: HF export (worker 0), reward plot, Ray shut down (also on errors, Ctrl-C, SIGTERM)

Same data, seeds, per-row keys and programs as CO, so the two end with the same parameters;
only where the host work runs, and what crosses processes, differ. The driver imports no
module that makes a JAX array: it never starts a JAX backend.

Tuned as a careful user would (see docs/runtime.md): one call per worker per phase issued to
all workers before waiting on any (2 round trips a step); every array through the object
store (zero-copy numpy), never pickled into a call; scoring spread over a worker pool the
size of the driver host's cores; prompts encoded by one batched tokenizer call.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray
from ray.exceptions import RayActorError

from compiler import ExecutionPlan, plan_to_json
from locojax.data import Problem, PromptStream, load_workload
from locojax.data.stream import DataPosition
from locojax.rewards import RewardBatch, Scorer
from locojax.runtime import assemble
from locojax.runtime.episode import episode_samples, score_episodes, scored_samples
from locojax.runtime.evaluation import eval_fields
from locojax.runtime.groups import GroupCounts, GroupPool, batch_problems
from locojax.runtime.hostwork import (
    NO_TURNS,
    Completions,
    HostTimes,
    HostWork,
    Prompts,
    TurnCounts,
    host_cores,
    say_failures,
)
from locojax.runtime.loop import Begun, StepDone, run_loop
from locojax.runtime.observe.stats import stats_row
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
from locojax.runtime.steps import close_run, eval_problems
from locojax.runtime.turns import (
    EVAL_STEP,
    Advance,
    Episodes,
    episode_rows,
    refilled,
    run_episodes,
    run_refilled,
    turn_setup,
    wave_rows,
    waves_of,
)
from locojax.single.messages import Generated, Trained, WorkerReady
from locojax.single.worker import HostWorker

WORKER_ENV = "LOCOJAX_SINGLE_WORKER"
"""Set in each worker's environment to its host index (tests find the processes by it)."""


@dataclass(frozen=True)
class Batch:
    """One batch of every sampling host's episodes, scored (host order)."""

    parts: list[Completions]
    rewards: RewardBatch
    rollout_s: list[float]
    """Each host's generation seconds."""
    truncated: int
    """Prompts cut to the plan's width."""
    turns: TurnCounts = NO_TURNS


class WorkerLost(RuntimeError):
    """A worker died; the run stops (its share of the training state is gone)."""


class SingleDriver:
    """Places the workers, runs the loop, does every host's host work, writes the metrics."""

    def __init__(self, plan: ExecutionPlan, run_dir: Path, log=print):
        self.plan, self.run_dir, self.log = plan, run_dir, log
        model = plan.model.config
        self.tokenizer = assemble.tokenizer_for(model, assemble.model_arch(model).vocab)
        self.workload = load_workload(assemble.workload_settings(plan.workload), plan.run.seed)
        assemble.check_alphabet(self.workload, self.tokenizer, plan.workload.prompt_template)
        self.stream = PromptStream(len(self.workload.train), plan.batch.prompts_per_step,
                                   DataPosition(plan.run.seed))
        self.scorer = Scorer(assemble.reward_settings(plan.workload),
                             workers=host_cores(plan, driver=True))
        self.work = HostWork(plan, self.tokenizer, self.scorer)
        sampling = assemble.sampling_settings(plan.sampling, plan.batch.response_len,
                                              self.tokenizer)
        self.turns = turn_setup(plan, self.tokenizer, sampling, host_cores(plan, driver=True))
        """Every host's environments and tools run here (None: single-turn episodes)."""
        hosts = plan.topology.hosts
        port, text = free_port(), plan_to_json(plan)
        cls = ray.remote(HostWorker)
        self.workers = []
        for h in range(hosts):
            env = {WORKER_ENV: str(h)} | ({} if hosts == 1 else coordinator_env(port, hosts, h))
            self.workers.append(cls.options(num_cpus=ACTOR_CPUS, max_restarts=0,
                                            runtime_env=actor_env(plan, env)).remote(
                text, h, str(run_dir.absolute())))
        self.ranges = [(r.start, r.stop) for r in plan.batch.prompt_ranges]
        self.step_now = 0

    # -- calls ------------------------------------------------------------------------------
    def _call(self, method: str, args_per_worker: list[tuple], times: HostTimes,
              hosts: list[int] | None = None) -> list[Generated] | list[Trained]:
        """`method` on every worker (or those of `hosts`) at once; the round trip beyond the
        slowest worker's own execution is dispatch time."""
        t0 = time.perf_counter()
        workers = self.workers if hosts is None else [self.workers[h] for h in hosts]
        refs = [getattr(w, method).remote(*a) for w, a in zip(workers, args_per_worker,
                                                              strict=True)]
        out = self._get(method, refs)
        wall = time.perf_counter() - t0
        times.add("dispatch", max(wall - max(o.exec_s for o in out), 0.0))
        times.dispatches += len(refs)
        return out

    def _get(self, method: str, refs: list) -> list:
        """The workers' replies; a dead worker ends the run in one line."""
        try:
            return ray.get(refs)
        except RayActorError as err:
            if failed_to_start(err):
                raise  # a worker's setup failed (a user error: the entry point's door names it)
            raise WorkerLost(f"a worker died in {method} at step {self.step_now}: {err}; rerun "
                             "the same command to resume from the last checkpoint") from err

    def _put(self, values: list, times: HostTimes) -> list[list]:
        """Each value into the object store (scatter); refs wrapped so workers fetch them."""
        t0 = time.perf_counter()
        refs = [[ray.put(v)] for v in values]
        times.add("scatter", time.perf_counter() - t0)
        return refs

    def _gather(self, outs: list[Generated], times: HostTimes) -> list[Completions]:
        """Every worker's completions, fetched here (host order)."""
        t0 = time.perf_counter()
        got = self._get("generate", [o.completions[0] for o in outs])
        times.add("gather", time.perf_counter() - t0 + max(o.put_s for o in outs))
        times.gather_bytes += sum(o.bytes for o in outs)
        return got

    def _sample(self, step: int, problems_per_host: list, times: HostTimes,
                greedy: bool = False, hosts: list[int] | None = None,
                batch: int = 0) -> tuple[list[Completions], list[Generated], int]:
        """Encode, scatter, generate on every worker (or those of `hosts`: their `batch`-th
        batch), gather: (completions per host, the workers' replies, prompts cut to the
        plan's width)."""
        t0 = time.perf_counter()
        prompts = [self.work.encode(p) for p in problems_per_host]
        times.add("batch", time.perf_counter() - t0)
        times.scatter_bytes += sum(p.ids_BxP.nbytes + p.len_B.nbytes for p in prompts)
        refs = self._put(prompts, times)
        outs = self._call("generate", [(step, r, greedy, batch) for r in refs], times, hosts)
        times.add("scatter", max(o.fetch_s for o in outs))
        return self._gather(outs, times), outs, sum(p.truncated for p in prompts)

    # -- the loop ---------------------------------------------------------------------------
    def _one_turn(self, step: int, problems: list[list[Problem]], times: HostTimes,
                  hosts: list[int], batch: int) -> Batch:
        """One reply per episode: generated on the workers, scored here."""
        parts, gen, cut = self._sample(step, problems, times, hosts=hosts, batch=batch)
        rewards = self.work.scored(Completions.concat(parts), [p for ps in problems for p in ps],
                                   times)
        return Batch(parts, rewards, [o.rollout_s for o in gen], cut)

    def _run_episodes(self, step: int, problems: list[list[Problem]], group: int,
                      times: HostTimes, hosts: list[int] | None, batch: int = 0,
                      eval_k: int = 0) -> tuple[Episodes, list[dict], np.ndarray, list]:
        """Multi-turn episodes of every host's problems (`group` each): each turn one round
        trip to the workers (their prompts scattered, their replies gathered), every
        environment and tool step here, as a single-controller agent loop does. (episodes,
        their rows, the hosts' row edges, each host's generation seconds)."""
        setup = self.turns
        flat = [p for ps in problems for p in ps]
        counts = [len(ps) * group for ps in problems]
        edges = np.cumsum([0, *counts])
        rollout = np.zeros(len(problems))
        steps = np.zeros(2, np.int64)
        """The workers' decode loops' (rows x steps, running rows' steps)."""
        waves = waves_of(counts, wave_rows(self.plan))

        def generate(prompts: Prompts, turn: int, wave: int) -> Completions:
            # Each host's episodes of this wave (its rows, hosts one after another).
            cuts = np.searchsorted(waves[wave], edges)
            shares = [Prompts(prompts.ids_BxP[a:b], prompts.len_B[a:b], 0)
                      for a, b in zip(cuts, cuts[1:], strict=False)]
            times.scatter_bytes += prompts.ids_BxP.nbytes + prompts.len_B.nbytes
            refs = self._put(shares, times)
            outs = self._call("turn", [(step, r, batch, turn, eval_k, wave) for r in refs],
                              times, hosts)
            times.add("scatter", max(o.fetch_s for o in outs))
            rollout[:] += [o.rollout_s for o in outs]
            steps[:] += np.sum([(o.slot_steps, o.live_steps) for o in outs], axis=0)
            return Completions.concat(self._gather(outs, times))

        rows = episode_rows(flat, group, setup.template, self.plan.run.seed,
                            EVAL_STEP if eval_k else step)
        if refilled(self.plan):
            advance = self._advance(step, batch, eval_k, times, hosts, rollout, steps)
            eps = run_refilled(rows, setup.runner, setup.fmt, setup.limits, advance, group,
                               counts, wave_rows(self.plan), self.plan.sampling.decode_quorum)
        else:
            eps = run_episodes(rows, setup.runner, setup.fmt, setup.limits, generate, group,
                               waves, self.plan.batch.waves_in_flight)
        eps = dataclasses.replace(eps, slot_steps=int(steps[0]), live_steps=int(steps[1]))
        return eps, rows, edges, list(rollout)

    def _advance(self, step: int, batch: int, eval_k: int, times: HostTimes,
                 hosts: list[int] | None, rollout: np.ndarray, steps: np.ndarray) -> Advance:
        """`runtime.turns.Advance` over the workers (per-episode scheduling): each call one
        round trip to every host with slots fed or running (host j's slots j * S on, S =
        `wave_rows`), its feeds scattered and its ended replies gathered."""
        per_host, begun = wave_rows(self.plan), set()

        def advance(feeds: dict, running: frozenset) -> dict:
            mine: dict[int, dict] = {}
            for slot, feed in feeds.items():
                mine.setdefault(slot // per_host, {})[slot % per_host] = feed
            busy = sorted(set(mine) | {slot // per_host for slot in running})
            times.scatter_bytes += sum(len(f.ids) * 4 for f in feeds.values())
            refs = self._put([mine.get(j, {}) for j in busy], times)
            outs = self._call("advance", [(step, r, batch, eval_k, j not in begun)
                                          for j, r in zip(busy, refs, strict=True)], times,
                              [hosts[j] if hosts is not None else j for j in busy])
            begun.update(busy)
            times.add("scatter", max(o.fetch_s for o in outs))
            for j, o in zip(busy, outs, strict=True):
                rollout[j] += o.rollout_s
                steps[:] += (o.slot_steps, o.live_steps)
            got = self._gather(outs, times)
            return {j * per_host + slot: reply for j, ended in zip(busy, got, strict=True)
                    for slot, reply in ended.items()}

        return advance

    def _episodes(self, step: int, problems: list[list[Problem]], times: HostTimes,
                  hosts: list[int], batch: int) -> Batch:
        """Every sampling host's episodes of one batch, scored here."""
        flat = [p for ps in problems for p in ps]
        eps, rows, edges, rollout = self._run_episodes(step, problems,
                                                       self.plan.batch.group_size, times,
                                                       hosts, batch)
        rewards = score_episodes(self.work, eps, flat, rows, times)
        c = eps.completions
        parts = [c.rows(a, b) for a, b in zip(edges, edges[1:], strict=False)]
        return Batch(parts, rewards, rollout, eps.prompts_cut, TurnCounts.of(eps))

    def _sample_groups(self, step: int, times: HostTimes) -> tuple[list[GroupPool], dict]:
        """Every host's batches of `step`: its prompts, then (dynamic sampling) further batches
        of its own prompts on the workers still short of informative groups, scored here
        (the rule of `runtime.groups`, per host as on a CO host). (pools, what the
        statistics need)."""
        pools = [GroupPool.of(self.plan, b - a) for a, b in self.ranges]
        seen = {"scored": [], "lengths": [], "truncated": 0, "rollout_s": [], "turns": NO_TURNS}
        sample = self._one_turn if self.turns is None else self._episodes
        for batch in range(pools[0].max_batches):
            hosts = [h for h, pool in enumerate(pools) if not batch or pool.wanting]
            if not hosts:
                break
            problems = [batch_problems(self.workload, self.stream, step, self.ranges[h], batch,
                                       pools[h].max_batches) for h in hosts]
            got = sample(step, problems, times, hosts, batch)
            edges = np.cumsum([0, *(len(p.lengths_B) for p in got.parts)])
            for h, part, a, b, r in zip(hosts, got.parts, edges, edges[1:], got.rollout_s,
                                        strict=False):
                pools[h].add(part, got.rewards.rewards_B[a:b], r)
            seen["scored"].append(got.rewards)
            seen["lengths"].append(np.concatenate([p.lengths_B for p in got.parts]))
            seen["truncated"] += got.truncated
            seen["rollout_s"].append(max(got.rollout_s))
            seen["turns"] = seen["turns"] + got.turns
        return pools, seen

    def _train_step(self, step: int) -> tuple[dict, Trained, np.ndarray]:
        """One step: (row timings, train metrics, statistics in STAT_KEYS order)."""
        times = HostTimes()
        pools, seen = self._sample_groups(step, times)
        t0 = time.perf_counter()
        built = [pool.rows(self.work) for pool in pools]
        per_host = [rows for rows, _ in built]
        times.add("batch", time.perf_counter() - t0)
        times.scatter_bytes += sum(v.nbytes for r in per_host for v in r.values())
        refs = self._put(per_host, times)
        outs = self._call("train", [(step, r) for r in refs], times)
        times.add("scatter", max(o.fetch_s for o in outs))
        s = times.seconds
        timing = {"rollout_s": sum(seen["rollout_s"]),
                  "reward_s": s["detok"] + s["score"], "advantage_s": s["batch"],
                  "train_s": max(o.train_s for o in outs),
                  "transfer_s": max(o.transfer_s for o in outs),
                  "compiles": max(o.compiles for o in outs), **times.fields()}
        # The workers sample each batch at once: its slowest one sets the extra seconds.
        counts = dataclasses.replace(GroupCounts.merged([c for _, c in built]),
                                     extra_rollout_s=sum(seen["rollout_s"][1:]))
        stats = stats_row(RewardBatch.concat(seen["scored"]), np.concatenate(seen["lengths"]),
                          seen["truncated"], timing, times, counts, seen["turns"])
        timing["rollout_s_per_host"] = [sum(pool.rollout_s) for pool in pools]
        return timing, outs[0], stats

    def _say_failures(self, when: str) -> None:
        """`hostwork.say_failures` of every host's reward functions, environments and tools
        (all run here)."""
        say_failures(when, self.scorer, self.turns.runner.tallies if self.turns else ())

    def evaluate(self, done: StepDone) -> dict[str, float]:
        """Held-out pass@1 (pass@k, maj@k), each host sampling its share (as in CO); the
        driver scores them all."""
        fields = self._evaluate(done)
        self._say_failures("evaluation")
        return fields

    def _evaluate(self, done: StepDone) -> dict[str, float]:
        """The evaluation of `evaluate`, its failures not yet told."""
        hosts, k = self.plan.topology.hosts, self.plan.run.eval_samples
        per_host = [eval_problems(self.workload, self.plan.workload.eval_prompts, h, hosts)
                    for h in range(hosts)]
        flat = [p for ps in per_host for p in ps]
        if self.turns is not None:
            eps, rows, _, _ = self._run_episodes(done.step, per_host, k, HostTimes(), None,
                                                 eval_k=k)
            return eval_fields(episode_samples(self.work, eps, flat, rows, len(flat),
                                               k).sums(), k)
        parts, _, _ = self._sample(done.step, per_host, HostTimes(), greedy=True)
        stop_ids = assemble.sampling_settings(self.plan.sampling, self.plan.batch.response_len,
                                              self.tokenizer).stop_ids
        sums = scored_samples(self.work, Completions.concat(parts), flat, k, stop_ids).sums()
        return eval_fields(sums, k)

    # -- runtime.loop.Mode ------------------------------------------------------------------
    progress_keys: dict[str, str] = {}

    def begin(self, log) -> Begun:
        """Every worker restores or initialises at once; worker 0's lines are the run's."""
        setup: WorkerReady = self._get("setup", [w.setup.remote() for w in self.workers])[0]
        for line in setup.log:
            log(line)
        return Begun(setup.start, setup.sft_loss)

    def step(self, step: int, stop: StopSignals, emit: Callable[[StepDone], None]
             ) -> int | None:
        """Step `step` through the workers; the driver is the one process the signal
        reaches, so its flag is the vote."""
        self.step_now, t0 = step, time.time()
        self.scorer.set_step(step, self.plan.batch.prompts_per_step, len(self.workload.train))
        timing, trained, stats = self._train_step(step)
        self._say_failures(f"step {step + 1}")
        emit(StepDone(step, t0, stats[None], dict(trained.metrics), timing))
        return int(stop.flag) or None

    def drain(self) -> list[StepDone]:
        return []

    def vote(self, flag: float) -> int | None:
        return int(flag) or None

    def save_now(self, done: int) -> Path:
        """Every worker saves the state after `done` steps (collective) and waits for it."""
        return Path(self._get("save_now", [w.save_now.remote(done) for w in self.workers])[0])

    def finish(self) -> Path | None:
        export = self._get("finish", [w.finish.remote() for w in self.workers])[0]
        return None if export is None else Path(export)

    def close(self) -> None:
        """Stop the driver's worker processes (scorer, environments and tools)."""
        self.scorer.close()
        if self.turns is not None:
            self.turns.close()


def run_single(plan: ExecutionPlan, run_dir: Path, log=print) -> int:
    """Run a single-controller plan: this process drives one Ray worker per host; exit code."""
    run_dir = Path(run_dir)
    try:
        with ray_cluster(run_dir / RAY_DIR, plan.topology.hosts, log):
            driver = SingleDriver(plan, run_dir, log)
            try:
                summary = run_loop(driver, plan, run_dir, log=log)
            finally:
                driver.close()
    except WorkerLost as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except Interrupted:
        raise  # Ray is shut down; the door says the line, exit 128 + the signal
    except KeyboardInterrupt:
        return interrupted()
    close_run(summary, run_dir,
              f"{plan.workload.name} on {plan.model.config.name} (single controller)")
    return 0

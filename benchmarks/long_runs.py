"""Long runs under faults (issue 62, item 8): host memory, processes and metrics rows.

    .venv/bin/python benchmarks/long_runs.py co [--steps 200] [--from-step 20] [--keep DIR]
    .venv/bin/python benchmarks/long_runs.py da [--steps 50] [--kill-every 10] [--keep DIR]

`co`: `python -m locojax` on the tiny arith model (`+experiment=arith_co`, the ascii
tokenizer) with benchmarks/long_run_env.py's environment (random latency, 5% of its steps
raising) over 3-turn episodes under `sampling.schedule=refill`, for `--steps` steps. The run's
resident memory is read at each new metrics row; its growth from the row of `--from-step` to
the last must stay under 10%. Every process of the run carries a marker in its environment:
after the run, none may be left (an orphan); none of the run's children may stay a zombie
for `ZOMBIE_S` (sampled every 0.2 s); the environment's failures make at most one warning
line a step.

`da`: a DA run (`+experiment=arith_da`, 2 rollout hosts and a trainer on a local Ray cluster)
of `--steps` steps whose rollout actor of host 0 is SIGKILLed every `--kill-every` steps;
every step's row must be there once, in order.

Prints a summary line per run and last a JSON line: {"co": {...}} or {"da": {...}}, with
`ok` true when every check held.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
from child_env import child_env

ROOT = Path(__file__).resolve().parents[1]
MARK = "LOCOJAX_LONG_RUN"
"""Environment variable every process of the run inherits (how leftovers are found)."""
CO = ["+experiment=arith_co", "model.tokenizer=ascii", "model.vocab=100",
      f"workload.env={ROOT / 'benchmarks' / 'long_run_env.py'}:Flaky", "workload.max_turns=3",
      "workload.prompts_per_step=8", "workload.group_size=4", "sampling.schedule=refill",
      "algorithm.sft_warmup_steps=0", "run.eval_every=0", "run.checkpoint_every=50"]
GROWTH_LIMIT = 0.10


def marked(token: str) -> list[psutil.Process]:
    """Processes of this user whose environment holds MARK=token (this one excluded)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARK) == token:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _rows(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


ZOMBIE_S = 2.0
"""A zombie child still there this long after it was first seen is counted (one caught between
its exit and its parent's wait is not)."""


def _sample(run: psutil.Process) -> tuple[int, int, set[int]]:
    """(the run's RSS, its descendants' RSS in bytes, its zombie descendants' pids)."""
    zombies, workers = set(), 0
    for kid in run.children(recursive=True):
        try:
            if kid.status() == psutil.STATUS_ZOMBIE:
                zombies.add(kid.pid)
            else:
                workers += kid.memory_info().rss
        except psutil.Error:
            continue
    return run.memory_info().rss, workers, zombies


def _watch(proc: subprocess.Popen, metrics: Path) -> dict:
    """RSS at every new metrics row, and the zombies that lasted, until the run ends."""
    run, rss, seen, first_seen, lasting = psutil.Process(proc.pid), {}, 0, {}, set()
    while proc.poll() is None:
        rows = _rows(metrics)
        try:
            main, kids, dead = _sample(run)
        except psutil.Error:
            break
        now = time.monotonic()
        first_seen = {pid: first_seen.get(pid, now) for pid in dead}
        lasting |= {pid for pid, t in first_seen.items() if now - t >= ZOMBIE_S}
        if rows > seen:
            rss[rows] = (main, kids)
            seen = rows
        time.sleep(0.2)
    return {"rss": rss, "zombies_lasting": len(lasting)}


def _series(rss: dict, first: int) -> dict:
    """The run's RSS in MiB at a few rows from `first` on, and its largest from there."""
    rows = sorted(r for r in rss if r >= first)
    marks = sorted({first, *(r for r in (50, 100, 150) if r in rss), max(rss, default=first)})
    return {"rss_mb": {r: round(rss[r][0] / 2**20, 1) for r in marks if r in rss},
            "rss_mb_max_from_first": round(max((rss[r][0] for r in rows), default=0) / 2**20, 1)}


def run_co(args: argparse.Namespace, work: Path) -> dict:
    token = uuid.uuid4().hex
    run_dir = work / "co"
    metrics = run_dir / "metrics.jsonl"
    cmd = [sys.executable, "-m", "locojax", *CO, f"run.steps={args.steps}",
           f"hydra.run.dir={run_dir}"]
    t0 = time.time()
    with open(work / "co.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(**{MARK: token}), stdout=log,
                                stderr=subprocess.STDOUT, text=True)
        seen = _watch(proc, metrics)
        proc.wait()
    err = (work / "co.log").read_text()
    said = re.findall(r"step (\d+): environment ", err)
    time.sleep(2 * 0.5 + 0.5)  # workers poll their parent every 0.5 s
    left = [p.pid for p in marked(token)]
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()] \
        if metrics.exists() else []
    rss = seen["rss"]
    first, last = rss.get(args.from_step), rss.get(max(rss, default=0))
    growth = (last[0] - first[0]) / first[0] if first and last else None
    out = {"rc": proc.returncode, "wall_s": round(time.time() - t0, 1), "steps": args.steps,
           "rows": len(steps), "rows_in_order": steps == list(range(args.steps)),
           f"rss_mb_step{args.from_step}": first and round(first[0] / 2**20, 1),
           f"rss_mb_step{max(rss, default=0)}": last and round(last[0] / 2**20, 1),
           "rss_growth": growth and round(growth, 4),
           "workers_rss_mb_first_last": [first and round(first[1] / 2**20, 1),
                                         last and round(last[1] / 2**20, 1)],
           **_series(rss, args.from_step),
           "zombies_lasting": seen["zombies_lasting"], "processes_left": len(left),
           "env_warning_lines": len(said), "env_warning_lines_max_a_step": max(
               (said.count(step) for step in set(said)), default=0),
           "tracebacks": err.count("Traceback")}
    out["ok"] = (proc.returncode == 0 and out["rows_in_order"] and growth is not None
                 and growth < GROWTH_LIMIT and not left and not out["tracebacks"]
                 and not out["zombies_lasting"] and out["env_warning_lines_max_a_step"] <= 1)
    return out


def run_da(args: argparse.Namespace, work: Path) -> dict:
    """The DA run, in this process (its driver): a rollout actor killed every few steps."""
    from compiler import compile_plan
    from locojax.config.compose import compose_config
    from locojax.disagg.driver import run_da as da
    from locojax.runtime.process.ray_cluster import ENV_TMPDIR

    os.environ.setdefault(ENV_TMPDIR, tempfile.mkdtemp(prefix="ljl-", dir="/tmp"))
    cfg = compose_config(["+experiment=arith_da", "mesh=cpu", "mesh.hosts=3",
                          "placement.rollout_fraction=0.67", f"run.steps={args.steps}",
                          "algorithm.sft_warmup_steps=2", "run.eval_every=0",
                          "run.checkpoint_every=10"])
    kills: list[int] = []

    def kill(step: int, rollout_pids: dict[int, int], trainer_pids: dict[int, int]) -> None:
        if step and step % args.kill_every == 0:
            host = min(rollout_pids)
            os.kill(rollout_pids[host], 9)
            kills.append(step)

    run_dir = work / "da"
    t0 = time.time()
    code = da(compile_plan(cfg, None), run_dir, on_step=kill, log=lambda _: None)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    out = {"rc": code, "wall_s": round(time.time() - t0, 1), "steps": args.steps,
           "kills_at": kills, "rows": len(rows), "rows_in_order": steps == list(range(
               args.steps)), "rollout_restarts": rows[-1].get("rollout_restarts") if rows
           else None}
    out["ok"] = code == 0 and out["rows_in_order"] and out["rollout_restarts"] == len(kills)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["co", "da"])
    p.add_argument("--steps", type=int)
    p.add_argument("--from-step", type=int, default=20)
    p.add_argument("--kill-every", type=int, default=10)
    p.add_argument("--keep", type=Path, help="keep the run directories here")
    args = p.parse_args()
    args.steps = args.steps or (200 if args.mode == "co" else 50)
    work = args.keep or Path(tempfile.mkdtemp(prefix="locojax-long-"))
    work.mkdir(parents=True, exist_ok=True)
    got = (run_co if args.mode == "co" else run_da)(args, work)
    print(", ".join(f"{k} {v}" for k, v in got.items()), file=sys.stderr)
    print(json.dumps({args.mode: got}))
    return 0 if got["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""LoCoJAX-CO vs the single controller as episodes get more turns, at 2 and 4 emulated hosts.

    .venv/bin/python benchmarks/multiturn.py [--turns 1 2 4 8] [--hosts 2 4] [--steps 3]
        [--env-step-ms 20] [--env-sleeps] [--env-jitter] [--overlap] [--refill]
        [--keep DIR [--reuse]]

Each run is `python -m locojax` on examples/guess's recipe (a small Qwen3 at the full Qwen
vocabulary and chat template) with benchmarks/multiturn_env.py's environment: every step
busy-waits `--env-step-ms` of CPU and never ends the episode, so every episode runs exactly
`workload.max_turns` turns. The episode length is sized for the most turns asked, so every
run has the same shapes (its programs compile once and come from the compilation cache).
For each (hosts, turns): CO (each host runs its own environments next to its decode) and the
single controller (one round trip to every worker per turn, every environment step in its
driver). The first step compiles and is dropped; figures are medians of the rest.

The runs give the plan `workload.env_step_s` (the environment's known step time). For each
host count, the cost model's constants are fitted to its 1-turn runs (CO and the single
controller; `compiler.cost.fit.fit_runs`, as `python -m locojax.calibrate` does: hosts
emulated on one machine share its cores, so its per-device rates depend on how many share
them), and every run's step is then predicted under them (`predicted_phases`): the
more-turn rows test the turn term (each turn's replies, environment steps and, for the
single controller, its round trip). `--reuse` reads the runs already in `--keep` instead of
running them again.

CO and the single controller run turn by turn (`sampling.schedule=static`: each turn one
wave's replies, then their environment steps; the single controller's one round trip a
turn, as the field's single-controller agent loops do). `--overlap` adds a run per (hosts,
turns): CO with two waves of episodes in flight (`sampling.env_overlap=true`: one wave
decodes while the other's environments run); `--refill` two: CO and the single controller
with per-episode turns (`sampling.schedule=refill`, the default: each episode's turn begins
as its environment answered, the other slots decoding meanwhile; the single controller's
round trip is one a chunk of decode steps); all predicted under the same constants.
`--env-sleeps` makes each step a sleep (a step waiting on a sandbox or a remote tool) rather
than CPU work, which on this machine shares the cores the emulated devices decode on;
`--env-jitter` draws each step's time from 0 to twice `--env-step-ms`.

Prints a table and last a JSON line {"rows": [{"hosts", "turns", "co_step_s",
"single_step_s", "single_over_co", "co_predicted_s", "single_predicted_s", "co": {...},
"single": {...}}, ...], "worst_error": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from child_env import child_env

from compiler.cost.fit import fit_runs, measured_phases, predicted_phases
from locojax.reports.calibration import load_run

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ["--config-dir", str(ROOT / "examples" / "guess" / "conf"), "+experiment=guess_co",
          f"workload.env={ROOT / 'benchmarks' / 'multiturn_env.py'}:Busy",
          "workload.prompts_per_step=8", "workload.group_size=4", "workload.max_response_len=8",
          "run.eval_every=0", "run.checkpoint_every=0"]
FIELDS = ("step_s", "rollout_s", "train_s", "reward_s", "env_s", "env_wait_s",
          "device_idle_frac", "turns_mean", "host_dispatch_s", "host_gather_s",
          "host_scatter_s", "host_other_s")
ANSWER_TOKENS = 16
"""Room per environment answer in the episode (`go on` in the chat template: 14 tokens)."""


STATIC = "sampling.schedule=static"
ARMS = {"local": ["controller=local", STATIC], "single": ["controller=single", STATIC],
        "overlap": ["controller=local", STATIC, "sampling.env_overlap=true"],
        "refill": ["controller=local", "sampling.schedule=refill"],
        "single_refill": ["controller=single", "sampling.schedule=refill"]}
"""Each arm's overrides: CO and the single controller turn by turn (one round trip to the
workers a turn), CO with two waves in flight, CO and the single controller with per-episode
turns (the single controller's round trip a chunk of decode steps)."""
EXTRA = {"overlap": ("overlap", "co_overlap"), "refill": ("refill", "co_refill"),
         "single_refill": ("refill", "single_refill")}
"""The optional arms: the flag that adds each, its rows' field prefix."""


def run(hosts: int, turns: int, most: int, arm: str, steps: int, env_ms: float,
        out: Path, sleeps: bool = False, jitter: bool = False) -> list[dict]:
    """One run's metrics rows; exits with its stderr tail on failure."""
    episode = most * 8 + (most - 1) * ANSWER_TOKENS
    cmd = [sys.executable, "-m", "locojax", *RECIPE, "mesh=cpu", f"mesh.hosts={hosts}",
           *ARMS[arm], f"run.steps={steps}", f"workload.max_turns={turns}",
           f"workload.max_episode_len={episode}", f"workload.env_step_s={env_ms / 1000}",
           f"hydra.run.dir={out}"]
    env = child_env(MULTITURN_ENV_STEP_MS=str(env_ms), MULTITURN_ENV_SLEEP=str(int(sleeps)),
                    MULTITURN_ENV_JITTER=str(int(jitter)))
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{arm} x{hosts} at {turns} turns failed:\n{done.stderr[-3000:]}")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def medians(rows: list[dict]) -> dict[str, float]:
    """Median of each field over the steps after the first (which compiles)."""
    steady = rows[1:] or rows
    return {k: statistics.median(r.get(k, 0.0) for r in steady) for k in FIELDS}


def predictions(dirs: dict[tuple[int, int, str], Path]) -> dict[tuple[int, int, str], float]:
    """Each run's predicted step seconds under constants fitted to the fewest-turn runs of
    its host count."""
    runs = {k: load_run(d) for k, d in dirs.items()}
    fewest, out = min(k[1] for k in runs), {}
    for hosts in {k[0] for k in runs}:
        mine = {k: v for k, v in runs.items() if k[0] == hosts}
        fitted = [(plan, measured_phases(rows)) for k, (plan, rows) in mine.items()
                  if k[1] == fewest and k[2] not in EXTRA]
        constants, _ = fit_runs(fitted, fitted[0][0].topology.hardware.cost)
        out |= {k: predicted_phases(plan, constants).step for k, (plan, _) in mine.items()}
    return out


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=3, help="steps per run (first dropped)")
    parser.add_argument("--env-step-ms", type=float, default=20.0)
    parser.add_argument("--env-sleeps", action="store_true",
                        help="each environment step sleeps rather than spends CPU")
    parser.add_argument("--env-jitter", action="store_true",
                        help="each step's time uniform in [0, 2 x --env-step-ms]")
    parser.add_argument("--overlap", action="store_true",
                        help="also run CO with two waves in flight (sampling.env_overlap)")
    parser.add_argument("--refill", action="store_true",
                        help="also run CO with per-episode turns (sampling.schedule=refill)")
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    parser.add_argument("--reuse", action="store_true",
                        help="read the runs already in --keep rather than running them")
    return parser.parse_args()


def _run_all(args, keep: Path, extra: set[str]) -> tuple[dict, dict]:
    """Every (hosts, turns, arm) run, or its rows read back under --reuse: their run
    directories and median rows."""
    most, dirs, got = max(args.turns), {}, {}
    for h in args.hosts:
        for t in args.turns:
            for ctl in [arm for arm in ARMS if arm in extra or arm not in EXTRA]:
                out = dirs[h, t, ctl] = keep / f"{h}h_{t}t_{ctl}"
                if args.reuse and (out / "metrics.jsonl").exists():
                    rows_ = [json.loads(x) for x in (out / "metrics.jsonl").read_text()
                             .splitlines()]
                else:
                    print(f"running {h} hosts, {t} turns, controller={ctl} -> {out}",
                          flush=True)
                    rows_ = run(h, t, most, ctl, args.steps, args.env_step_ms, out,
                                args.env_sleeps, args.env_jitter)
                got[h, t, ctl] = medians(rows_)
    return dirs, got


def _rows(args, got: dict, predicted: dict, extra: set[str]) -> list[dict]:
    """One row per (hosts, turns): CO against the single controller and the extra arms."""
    rows = []
    for h in args.hosts:
        for t in args.turns:
            co, single = got[h, t, "local"], got[h, t, "single"]
            rows.append({"hosts": h, "turns": t, "co_step_s": co["step_s"],
                         "single_step_s": single["step_s"],
                         "single_over_co": single["step_s"] / co["step_s"],
                         "co_predicted_s": predicted[h, t, "local"],
                         "single_predicted_s": predicted[h, t, "single"],
                         "co": co, "single": single})
            for arm in extra:
                got_ = got[h, t, arm]
                f = EXTRA[arm][1]
                rows[-1] |= {f"{f}_step_s": got_["step_s"],
                             f"{f}_predicted_s": predicted[h, t, arm],
                             f"{arm}_over_co": got_["step_s"] / co["step_s"], f: got_}
    return rows


def _print_tables(rows: list[dict], extra: set[str]) -> None:
    print(f"\n{'hosts':>5} {'turns':>5} {'CO s':>8} {'predicted':>9} {'single s':>9} "
          f"{'predicted':>9} {'single/CO':>9} {'CO env_s':>9} {'single env_s':>12}")
    for r in rows:
        print(f"{r['hosts']:>5} {r['turns']:>5} {r['co_step_s']:8.3f} "
              f"{r['co_predicted_s']:9.3f} {r['single_step_s']:9.3f} "
              f"{r['single_predicted_s']:9.3f} {r['single_over_co']:9.3f} "
              f"{r['co']['env_s']:9.3f} {r['single']['env_s']:12.3f}")
    for arm in sorted(extra):
        f = EXTRA[arm][1]
        print(f"\n{'hosts':>5} {'turns':>5} {'CO s':>8} {arm + ' s':>9} {'predicted':>9} "
              f"{arm + '/CO':>10} {'CO idle':>8} {arm + ' idle':>12} {'CO wall':>8} "
              f"{arm + ' wall':>12}")
        for r in rows:
            wall = [x["rollout_s"] + x["env_wait_s"] for x in (r["co"], r[f])]
            print(f"{r['hosts']:>5} {r['turns']:>5} {r['co_step_s']:8.3f} "
                  f"{r[f + '_step_s']:9.3f} {r[f + '_predicted_s']:9.3f} "
                  f"{r[arm + '_over_co']:10.3f} {r['co']['device_idle_frac']:8.3f} "
                  f"{r[f]['device_idle_frac']:12.3f} {wall[0]:8.3f} {wall[1]:12.3f}")


def main() -> None:
    args = _args()
    keep = args.keep or Path(tempfile.mkdtemp(prefix="multiturn-bench-"))
    extra = {arm for arm, (flag, _) in EXTRA.items() if getattr(args, flag)}
    dirs, got = _run_all(args, keep, extra)
    rows = _rows(args, got, predictions(dirs), extra)
    _print_tables(rows, extra)
    arms = ("co", "single", *(EXTRA[a][1] for a in sorted(extra)))
    worst = max(abs(r[f"{m}_predicted_s"] / r[f"{m}_step_s"] - 1) for r in rows
                for m in arms)
    print(f"\nworst |predicted / measured - 1|: {worst:.3f} (constants fitted to each host "
          f"count's {min(args.turns)}-turn runs)\nrun directories: {keep}")
    print(json.dumps({"rows": rows, "worst_error": worst, "env_step_ms": args.env_step_ms,
                      "env_sleeps": args.env_sleeps, "env_jitter": args.env_jitter,
                      "cores": os.cpu_count()}))


if __name__ == "__main__":
    main()

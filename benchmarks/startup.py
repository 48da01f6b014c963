"""Time to the first RL step: LoCoJAX-CO against the single controller on the same plan.

    .venv/bin/python benchmarks/startup.py [--runs 2] [--keep DIR] [overrides ...]

Runs `python -m locojax +experiment=arith_co mesh=cpu mesh.hosts=2 run.steps=1
run.eval_every=0 run.checkpoint_every=0 <overrides>` with `controller=local` and with
`controller=single`, `--runs` times each, alternating, every run with an empty JAX compilation
cache of its own first (cold: what a user's first run pays) and then once more on that warm
cache. Every line the run prints is stamped with the seconds since the command started.

Time to first step = when step 1's progress line appears, less that step's `step_s` in
metrics.jsonl: everything before the first RL step starts (interpreter, composition, plan,
re-exec, Ray, workers, restore or initialisation, the supervised warm-up, compiles that
precede the step). Prints each run's stamped start-up lines, then a JSON line:
{"co": {"cold_s": [...], "warm_s": [...]}, "single": {...}, "single_over_co_cold",
"single_over_co_warm"} (medians' ratios).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from child_env import child_env

ROOT = Path(__file__).resolve().parents[1]
PLAN = ["+experiment=arith_co", "mesh=cpu", "mesh.hosts=2", "run.steps=1", "run.eval_every=0",
        "run.checkpoint_every=0"]
MODES = {"co": "controller=local", "single": "controller=single"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _stamped(cmd: list[str], env: dict[str, str]) -> tuple[int, list[tuple[float, str]]]:
    """(exit code, (seconds since start, line) of every stdout and stderr line)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []

    def read(stream) -> None:
        for line in stream:
            lines.append((time.monotonic() - t0, line.rstrip()))

    readers = [threading.Thread(target=read, args=(s,)) for s in (proc.stdout, proc.stderr)]
    for r in readers:
        r.start()
    code = proc.wait()
    for r in readers:
        r.join()
    return code, sorted(lines)


def first_step_s(run_dir: Path, lines: list[tuple[float, str]]) -> float:
    """When step 1 began: its progress line's stamp less its step_s."""
    stamp = next(t for t, line in lines if line.startswith("step 1/"))
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    return stamp - row["step_s"]


def one_run(mode: str, cache: Path, out: Path, overrides: list[str]) -> float:
    env = child_env(JAX_COMPILATION_CACHE_DIR=str(cache),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
    cmd = [sys.executable, "-m", "locojax", *PLAN, MODES[mode], *overrides,
           f"hydra.run.dir={out}"]
    code, lines = _stamped(cmd, env)
    if code != 0:
        raise SystemExit(f"{mode}: exit {code}\n" + "\n".join(x for _, x in lines[-30:]))
    for t, line in lines:
        if not line.startswith(("step ", "│", "┃", "┏", "┗", "┡", "└", "╭", "╰")):
            log(f"  {t:7.2f} s  {line[:150]}")
    return first_step_s(out, lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--keep", type=Path, default=None, help="keep the run dirs here")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    root = Path(args.keep or tempfile.mkdtemp(prefix="ljstart-"))
    times = {m: {"cold_s": [], "warm_s": []} for m in MODES}
    for i in range(args.runs):
        for mode in MODES:
            cache = root / f"cache-{mode}-{i}"
            for kind in ("cold_s", "warm_s"):
                log(f"{mode} run {i} ({kind[:-2]} cache):")
                s = one_run(mode, cache, root / f"{mode}-{i}-{kind[:-2]}", args.overrides)
                times[mode][kind].append(s)
                log(f"  -> first step began at {s:.2f} s")
    report = dict(times)
    for kind in ("cold_s", "warm_s"):
        co, single = (statistics.median(times[m][kind]) for m in MODES)
        report[f"single_over_co_{kind[:-2]}"] = single / co
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()

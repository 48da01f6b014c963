"""LoCoJAX-CO vs the single controller on the same GSM8K step, 2 emulated hosts, same cores.

    .venv/bin/python benchmarks/controller.py [--steps 8] [--hosts 2] [--data ../shared/data/gsm8k]

Runs `python -m locojax +experiment=gsm8k_co model=tiny` (real GSM8K prompts and rewards,
the tiny Qwen3 at the full 151,936 vocabulary, CPU sizing) twice: `controller=local`
(2 host processes joined by jax.distributed, each rolling out and scoring its own prompts) and
`controller=single` (one process driving both hosts' devices and scoring every sample). Each
run's first step (compilation) is dropped; figures are medians over the remaining steps of
`metrics.jsonl`. Prints the breakdown; the last line is JSON:
{"co_step_s", "single_step_s", "speedup", "co_host_other_share", ...}.
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

from locojax.runtime.metrics import read_metrics
from locojax.runtime.run_dir import METRICS_FILE

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("rollout_s", "reward_s", "advantage_s", "train_s", "transfer_s", "host_other_s")


def run(controller: str, steps: int, hosts: int, data: Path, out: Path) -> list[dict]:
    """One run's metric rows."""
    cmd = [sys.executable, "-m", "locojax", "+experiment=gsm8k_co", "model=tiny",
           f"workload.data_dir={data}", "mesh=cpu", f"mesh.hosts={hosts}",
           f"controller={controller}", f"run.steps={steps}", "run.eval_every=0",
           "run.checkpoint_every=0", f"hydra.run.dir={out}"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{controller} run failed:\n{done.stderr[-2000:]}")
    return read_metrics(out / METRICS_FILE)


def medians(rows: list[dict]) -> dict[str, float]:
    """Median of each timing over the steps after the first (which compiles)."""
    steady = rows[1:] or rows
    return {k: statistics.median(r[k] for r in steady) for k in ("step_s", *PARTS)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "gsm8k")
    args = parser.parse_args()
    if not (args.data / "train.jsonl").exists():
        sys.exit(f"GSM8K not found at {args.data}: pass --data <dir with train.jsonl>")
    with tempfile.TemporaryDirectory() as tmp:
        co = medians(run("local", args.steps, args.hosts, args.data, Path(tmp) / "co"))
        single = medians(run("single", args.steps, args.hosts, args.data, Path(tmp) / "single"))
    print(f"{'phase':>14} {'CO (local)':>12} {'single':>12}")
    for key in ("step_s", *PARTS):
        print(f"{key:>14} {co[key]:12.3f} {single[key]:12.3f}")
    result = {
        "co_step_s": co["step_s"],
        "single_step_s": single["step_s"],
        "speedup": single["step_s"] / co["step_s"],
        "co_host_other_share": co["host_other_s"] / co["step_s"],
        "co": co,
        "single": single,
        "hosts": args.hosts,
        "steps_measured": args.steps - 1,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

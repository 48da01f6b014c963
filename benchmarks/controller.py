"""LoCoJAX-CO vs the single controller, measured and predicted, at 2 and 4 emulated hosts.

    .venv/bin/python benchmarks/controller.py [--steps 4] [--hosts 2 4] [--keep DIR]

For each workload (GSM8K, real prompts and rewards; NuminaMath-style MATH500 prompts scored by
math-verify) and host count, runs `python -m locojax` with the tiny Qwen3 at the full Qwen
vocabulary (CPU sizing) twice: `controller=local` (one jax.distributed process per host, each
rolling out, scoring and batching its own prompts) and `controller=single` (a driver process
that owns no devices and one Ray worker per host; every completion gathered to the driver,
detokenised and scored there on a pool of this machine's cores, rows sent back). The first
step of each run compiles and is dropped; figures are medians over the remaining steps.

The predicted single/CO ratio of a row comes from the cost model with constants fitted
(`compiler.cost.fit.fit_runs`) to the OTHER rows' runs only (leave one row out), so
no prediction has seen its own row. Prints the phase and host-cost split of every run, the
predicted host costs next to the measured ones, and last a JSON line:
{"rows": [{"workload", "hosts", "co_step_s", "single_step_s", "speedup", "predicted_speedup",
"co": {...}, "single": {...}}, ...]}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from child_env import child_env

from compiler.cost.fit import fit_runs, measured_phases, predicted_phases
from locojax.runtime.observe.metrics import read_metrics
from locojax.runtime.rundir.files import METRICS_FILE, load_plan

ROOT = Path(__file__).resolve().parents[1]

DATA = ROOT.parent / "shared" / "data"
WORKLOADS = {
    "gsm8k": ["+experiment=gsm8k_co", f"workload.data_dir={DATA / 'gsm8k'}"],
    "numina_math500": ["+experiment=numina_co", f"workload.data_dir={DATA / 'math500' / 'test.jsonl'}"],
}
PHASES = ("step_s", "rollout_s", "reward_s", "advantage_s", "train_s", "transfer_s",
          "host_other_s")
HOST = ("host_dispatch_s", "host_gather_s", "host_scatter_s", "host_detok_s", "host_score_s",
        "host_batch_s")
PREDICTED = {"host_dispatch_s": "dispatch", "host_gather_scatter_s": "gather",
             "host_detok_s": "detok", "host_score_s": "score", "host_batch_s": "batch"}
"""Measured medians next to the cost model's phase of the same name."""


def run(workload: str, controller: str, hosts: int, steps: int, out: Path) -> Path:
    """One run into `out`; exits with its stderr tail on failure."""
    cmd = [sys.executable, "-m", "locojax", *WORKLOADS[workload], "model=tiny", "mesh=cpu",
           f"mesh.hosts={hosts}", f"controller={controller}", f"run.steps={steps}",
           "run.eval_every=0", "run.checkpoint_every=0", f"hydra.run.dir={out}"]
    done = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{workload} {controller} x{hosts} failed:\n{done.stderr[-3000:]}")
    return out


def load(run_dir: Path):
    return load_plan(run_dir), read_metrics(run_dir / METRICS_FILE)


def medians(rows: list[dict]) -> dict[str, float]:
    """Median of each timing over the steps after the first (which compiles)."""
    steady = rows[1:] or rows
    out = {k: statistics.median(r[k] for r in steady) for k in (*PHASES, *HOST)}
    out["host_gather_scatter_s"] = statistics.median(r["host_gather_s"] + r["host_scatter_s"]
                                                     for r in steady)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="steps per run (first dropped)")
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    args = parser.parse_args()
    for need in (DATA / "gsm8k" / "train.jsonl", DATA / "math500" / "test.jsonl"):
        if not need.exists():
            sys.exit(f"data not found: {need}")
    keep = args.keep or Path(tempfile.mkdtemp(prefix="controller-bench-"))
    runs = {}
    for wl in args.workloads:
        for h in args.hosts:
            for ctl in ("local", "single"):
                out = keep / f"{wl}_{h}h_{ctl}"
                print(f"running {wl} on {h} hosts, controller={ctl} -> {out}", flush=True)
                runs[(wl, h, ctl)] = load(run(wl, ctl, h, args.steps, out))
    measured = {k: measured_phases(rows) for k, (_, rows) in runs.items()}
    rows = []
    for wl in args.workloads:
        for h in args.hosts:
            # Constants from every other row's runs (leave this row out).
            others = [(runs[k][0], measured[k]) for k in runs if k[:2] != (wl, h)]
            if not {p.controller.kind for p, _ in others} >= {"local", "single"}:
                others = [(runs[k][0], measured[k]) for k in runs]  # one row: in-sample
                print(f"note: {wl} x{h} predicted from its own runs (no other row)")
            start = runs[(wl, h, "local")][0].topology.hardware.cost
            fitted, _ = fit_runs(others, start)
            co_plan, single_plan = runs[(wl, h, "local")][0], runs[(wl, h, "single")][0]
            pred_co, pred_single = (predicted_phases(co_plan, fitted),
                                    predicted_phases(single_plan, fitted))
            co, single = medians(runs[(wl, h, "local")][1]), medians(runs[(wl, h, "single")][1])
            for side, pred in ((co, pred_co), (single, pred_single)):
                side["predicted"] = {"step_s": pred.step, **{
                    k: getattr(pred, v) for k, v in PREDICTED.items()}}
            rows.append({"workload": wl, "hosts": h, "co_step_s": co["step_s"],
                         "single_step_s": single["step_s"],
                         "speedup": single["step_s"] / co["step_s"],
                         "predicted_speedup": pred_single.step / pred_co.step,
                         "co": co, "single": single})
    for r in rows:
        print(f"\n{r['workload']}, {r['hosts']} hosts: CO {r['co_step_s']:.3f} s, single "
              f"{r['single_step_s']:.3f} s per step: measured single/CO {r['speedup']:.3f}x, "
              f"predicted {r['predicted_speedup']:.3f}x "
              f"({(r['predicted_speedup'] / r['speedup'] - 1):+.1%})")
        print(f"{'':>16} {'CO':>10} {'(pred)':>10} {'single':>10} {'(pred)':>10}")
        for k in (*PHASES, *HOST, "host_gather_scatter_s"):
            pc = r["co"]["predicted"].get(k, float("nan"))
            ps = r["single"]["predicted"].get(k, float("nan"))
            print(f"{k:>16} {r['co'][k]:10.4f} {pc:10.4f} {r['single'][k]:10.4f} {ps:10.4f}")
    print(f"\nrun directories: {keep}")
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()

"""The tool demo against the same model and steps without the tool.

    .venv/bin/python benchmarks/tool_demo.py [--steps 200] [--keep DIR [--reuse]]
        [--png docs/arith_tools_co.png] [override ...]

Runs `python -m locojax +experiment=arith_tools_co` (sums of two 3-digit numbers, the `add`
tool, 2 turns) and the same command with `~workload.tools.add workload.max_turns=1` (one reply,
the same warm-up length on the plain "#### <sum>" solutions), `--steps` RL steps each, and
plots both reward curves (the mean reward of each step; accuracy dashed) to `--png`. The
demo's targets (issue 38): its reward rises by at least 0.4 from the first step to the mean
of the last 10, and that mean ends at least 0.3 above the run without the tool. `--reuse`
reads the runs already in `--keep`. Overrides after the options go to both runs (the test
suite's smoke run: `--steps 2 algorithm.sft_warmup_steps=2`).

Prints a table and last a JSON line {"tools": {"first", "last10", "rise", "accuracy_last10",
"wall_s"}, "no_tool": {...}, "gap": last10 difference, "rise_ok", "gap_ok"}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from child_env import child_env

ROOT = Path(__file__).resolve().parents[1]
RUNS = {"tools": ["+experiment=arith_tools_co"],
        "no_tool": ["+experiment=arith_tools_co", "~workload.tools.add", "workload.max_turns=1"]}
WINDOW = 10


def run(name: str, steps: int, overrides: list[str], out: Path) -> None:
    cmd = [sys.executable, "-m", "locojax", *RUNS[name], f"run.steps={steps}",
           "run.checkpoint_every=0", f"run.eval_every={steps}", *overrides,
           f"hydra.run.dir={out}"]
    print(f"{name}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: the {name} run failed:\n{done.stderr[-3000:]}")


def figures(run_dir: Path) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in rows]
    last = rows[-WINDOW:]
    last10 = sum(r["reward_mean"] for r in last) / len(last)
    return {"first": rewards[0], "last10": last10, "rise": last10 - rewards[0],
            "accuracy_last10": sum(r["accuracy"] for r in last) / len(last),
            "wall_s": sum(r["step_s"] for r in rows), "rewards": rewards,
            "accuracy": [r["accuracy"] for r in rows]}


def plot(runs: dict[str, dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (name, f), color in zip(runs.items(), ("tab:blue", "tab:gray"), strict=True):
        label = "with the add tool" if name == "tools" else "without it"
        ax.plot(f["rewards"], color=color, label=f"reward, {label}")
        ax.plot(f["accuracy"], color=color, linestyle="--", alpha=0.6,
                label=f"accuracy, {label}")
    ax.set(xlabel="RL step", ylabel="mean over the step's episodes", ylim=(0, 1.05),
           title="arith_tools_co: 3-digit sums, tiny model, after its warm-up")
    ax.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--keep", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "arith_tools_co.png")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of both runs")
    args = parser.parse_args()
    keep = args.keep or Path(tempfile.mkdtemp(prefix="tool-demo-"))
    runs = {}
    for name in RUNS:
        if not args.reuse:
            run(name, args.steps, args.overrides, keep / name)
        runs[name] = figures(keep / name)
    plot(runs, args.png)
    gap = runs["tools"]["last10"] - runs["no_tool"]["last10"]
    print("| run | first step | last 10 | rise | accuracy (last 10) | step seconds |")
    print("|---|---|---|---|---|---|")
    for name, f in runs.items():
        print(f"| {name} | {f['first']:.3f} | {f['last10']:.3f} | {f['rise']:+.3f} | "
              f"{f['accuracy_last10']:.3f} | {f['wall_s']:.0f} |")
    print(f"curves: {args.png}", file=sys.stderr)
    summary = {name: {k: v for k, v in f.items() if k not in ("rewards", "accuracy")}
               for name, f in runs.items()}
    print(json.dumps({**summary, "gap": gap, "rise_ok": runs["tools"]["rise"] >= 0.4,
                      "gap_ok": gap >= 0.3}))


if __name__ == "__main__":
    main()

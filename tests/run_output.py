"""What every mode prints on a run's stderr, checked the same way for CO, DA and the single
controller (the e2e tests of each mode call `check_run_output` on their own run)."""

from __future__ import annotations

import re
from pathlib import Path

PROGRESS = re.compile(r"step (\d+)/(\d+) \((\d+)%\) reward=\S+ step_s=\S+(?: \w+=\S+)* "
                      r"\| \S+ s/step \| ETA \d+:\d\d:\d\d")
"""One step's line when stderr is not a terminal (the same in every mode; DA adds fields)."""
SUMMARY_ROWS = ("steps run", "reward (first step -> mean of last 10)", "accuracy (last step)",
                "wall time", "metrics", "plot", "final policy (HF)")
"""The summary table's rows, in order, in every mode."""
ELLIPSIS = "\u2026"
ROW_KEYS = {"step", "reward_mean", "reward_std", "accuracy", "response_len_mean", "tokens",
            "entropy", "clip_frac", "pg_loss", "advantage_mean", "tokens_per_s", "step_s",
            "rollout_s", "reward_s", "advantage_s", "train_s", "transfer_s", "host_other_s",
            "host_dispatch_s", "host_gather_s", "host_scatter_s", "host_detok_s", "host_score_s", "host_batch_s", "host_samples", "frac_zero_std",
            "groups_sampled", "groups_padded", "sample_batches", "extra_rollout_s",
            "logp_mismatch_mean", "logp_mismatch_max", "rc_weight_mean", "rc_clip_frac"}
"""Keys of every metrics.jsonl row of arith_co's defaults in every mode (CO, DA, the single
controller: one row builder, `runtime.steps.metrics_row`); a mode adds its own."""


def progress_steps(stderr: str) -> list[int]:
    """The step counts of the progress lines, in order."""
    return [int(m[1]) for m in map(PROGRESS.fullmatch, stderr.splitlines()) if m]


def summary_rows(stderr: str) -> list[tuple[str, str]]:
    """(name, value) of each row of the summary table."""
    rows = []
    for line in stderr.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 2 and cells[0]:
            rows.append((cells[0], cells[1]))
    return rows


def check_run_output(stderr: str, run_dir: Path, steps: int, start: int = 0) -> None:
    """One whole progress line per step run, the shared summary table naming the run's files
    in full, nothing cut with an ellipsis (stderr is a pipe here, as under Slurm)."""
    assert ELLIPSIS not in stderr, stderr[-3000:]
    assert progress_steps(stderr) == list(range(start + 1, steps + 1)), stderr[-3000:]
    rows = dict(summary_rows(stderr))
    assert [name for name in SUMMARY_ROWS if name in rows] == list(SUMMARY_ROWS), rows
    assert rows["steps run"] == str(steps - start)
    assert rows["metrics"] == str(Path(run_dir).absolute() / "metrics.jsonl") or \
        rows["metrics"] == str(Path(run_dir) / "metrics.jsonl"), rows
    assert rows["final policy (HF)"].endswith("hf") and rows["plot"].endswith("rewards.png")

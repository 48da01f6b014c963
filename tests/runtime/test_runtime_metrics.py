"""MetricsWriter (JSONL + TensorBoard), StepProgress, summary table and run plots."""

import io
import json
import struct
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
from rich.console import Console
from tensorboardX.proto import event_pb2

from locojax.reports.plan_sweep import swept
from locojax.runtime.observe.metrics import MetricsWriter, read_metrics
from locojax.runtime.observe.plots import plot_run, plot_sweep, run_figure
from locojax.runtime.observe.progress import StepProgress, print_summary


def _tb_scalars(tb_dir):
    """{(tag, step): value} read from the raw TFRecord event files."""
    out = {}
    for f in sorted(tb_dir.glob("events.out.tfevents.*")):
        data = f.read_bytes()
        pos = 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + n])
            pos += 12 + n + 4
            for v in event.summary.value:
                out[(v.tag, event.step)] = v.simple_value
    return out


def _row(step, phase="rl"):
    return {
        "step": step,
        "phase": phase,
        "reward_mean": np.float32(0.1 * step),
        "accuracy": jnp.asarray(0.05 * step),
        "num_tokens": np.int64(100 + step),
        "rollout_s": 0.5,
        "reward_s": 0.05,
        "advantage_s": 0.01,
        "train_s": 0.8,
        "transfer_s": 0.1,
        "host_other_s": 0.02,
    }


def test_jsonl_rows_plain_numbers_and_tensorboard(tmp_path):
    with MetricsWriter(tmp_path) as w:
        for step in range(3):
            w.write(_row(step))
        w.write({"step": 3, "loss": float("nan"), "flag": True})
        # flushed after each row: readable while the writer is still open
        assert len(read_metrics(tmp_path / "metrics.jsonl")) == 4
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    first = json.loads(lines[2])
    assert type(first["reward_mean"]) is float and first["reward_mean"] == pytest.approx(0.2)
    assert type(first["num_tokens"]) is int and first["num_tokens"] == 102
    assert type(first["accuracy"]) is float and first["phase"] == "rl"
    assert json.loads(lines[3]) == {"step": 3, "loss": None, "flag": True}
    tb = _tb_scalars(tmp_path / "tb")
    assert tb[("reward_mean", 2)] == pytest.approx(0.2)
    assert tb[("train_s", 1)] == pytest.approx(0.8)
    assert ("phase", 0) not in tb and ("step", 0) not in tb and ("flag", 3) not in tb


def test_truncate_from_then_resume_has_each_step_once(tmp_path):
    with MetricsWriter(tmp_path) as w:
        for step in range(6):
            w.write(_row(step))
    with MetricsWriter(tmp_path) as w:  # resumed run from a checkpoint at step 4
        assert w.truncate_from(4) == 4
        for step in range(4, 8):
            w.write(_row(step))
    steps = [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")]
    assert steps == list(range(8))


def test_killed_run_keeps_rows(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal
        from locojax.runtime.observe.metrics import MetricsWriter
        w = MetricsWriter({str(tmp_path)!r})
        for s in range(5):
            w.write({{"step": s, "reward_mean": s / 10}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert proc.returncode == -9
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "rew')  # a torn last line is skipped, not fatal
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == list(range(5))


def test_disabled_writer_writes_nothing(tmp_path):
    w = MetricsWriter(tmp_path / "run", enabled=False)
    w.write(_row(0))
    assert w.truncate_from(0) == 0
    w.close()
    assert not (tmp_path / "run").exists()


def _progress_output(is_tty: bool, total: int, **kw) -> str:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=is_tty, width=120)
    with StepProgress(total, console=console, **kw) as bar:
        for step in range(kw.get("start_step", 0), total):
            bar.update(step + 1, reward=0.5, loss=1.25)
    return buf.getvalue()


def test_progress_plain_lines_when_not_tty():
    out = _progress_output(False, 100)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 100, lines  # a batch system's log keeps one line per step
    assert [ln.split()[1] for ln in lines] == [f"{s}/100" for s in range(1, 101)]
    assert "100/100" in lines[-1] and "reward=0.5" in lines[-1] and "ETA" in lines[-1]
    assert "\x1b" not in out  # no escape codes in CI logs


def test_nothing_is_cut_when_stderr_is_not_a_terminal(capsys):
    """Piped (Slurm, Kubernetes): the summary table and the progress lines keep every path
    and number whole, however long; rich would cut them at 80 columns with an ellipsis."""
    long = "/" + "/".join(["a-rather-long-directory-name"] * 6) + "/metrics.jsonl"
    print_summary([("metrics", long), ("reward", "1.0987654321e-05 -> 0.123456789")])
    with StepProgress(2) as bar:
        for s in range(2):
            bar.update(s + 1, reward=0.123456789, path_like=long)
    err = capsys.readouterr().err
    assert long in err and "1.0987654321e-05" in err and "\u2026" not in err, err
    assert len([ln for ln in err.splitlines() if ln.startswith("step ")]) == 2


def test_progress_resumed_and_tty():
    out = _progress_output(False, 20, start_step=15)
    assert "20/20" in out and "1/20" not in out
    out = _progress_output(True, 10)
    assert "10/10" in out and "reward" in out


def test_progress_disabled_and_default_stderr(capsys):
    with StepProgress(5, enabled=False) as bar:
        bar.update(5, reward=1.0)
    with StepProgress(3) as bar:
        for s in range(3):
            bar.update(s + 1, reward=1.0)
    captured = capsys.readouterr()
    assert captured.out == ""


def test_print_summary_table():
    buf = io.StringIO()
    print_summary(
        [("final reward", "0.93"), ("steps", "200")],
        "Run summary",
        console=Console(file=buf, width=80),
    )
    out = buf.getvalue()
    assert "Run summary" in out and "final reward" in out and "0.93" in out


def test_plot_run_and_sweep(tmp_path):
    with MetricsWriter(tmp_path) as w:
        for step in range(10):
            row = _row(step, phase="sft" if step < 4 else "rl")
            if step % 5 == 4:
                row["eval_greedy_accuracy"] = 0.3 + 0.01 * step
            w.write(row)
    out = plot_run(tmp_path / "metrics.jsonl", tmp_path / "run.png", rl_start_step=4, title="t")
    assert out.exists() and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000
    rows = [{"batch": b, "measured": 0.1 * b, "predicted": 0.09 * b} for b in (8, 16, 32)]
    sweep = plot_sweep(rows, "batch", "measured", "predicted", tmp_path / "sweep.png")
    assert sweep.read_bytes()[:4] == b"\x89PNG"


def test_plot_run_without_timing_or_accuracy(tmp_path):
    with MetricsWriter(tmp_path) as w:
        for step in range(3):
            w.write({"step": step, "reward_mean": step / 3})
    out = plot_run(tmp_path / "metrics.jsonl", tmp_path / "p.png")
    assert out.stat().st_size > 5_000


def test_a_short_run_has_whole_step_ticks_and_legends_beside_the_axes():
    rows = [_row(step) for step in range(3)]
    fig = run_figure(rows)
    reward, timing = fig.axes
    assert all(float(t).is_integer() for t in timing.get_xticks())
    for ax in (reward, timing):  # anchored right of the axes: no bar or line under it
        assert ax.get_legend()._loc == 2 and ax.get_legend().get_bbox_to_anchor().x0 > \
            ax.get_window_extent().x1 - 1


def test_da_timing_shows_the_overlap_and_the_wall_time():
    """DA's rollout and training overlap: two bars side by side per step and the wall time as
    a line (a stacked bar would be taller than the step)."""
    rows = [{"step": s, "reward_mean": 0.1, "rollout_s": 2.0, "reward_s": 0.1,
             "advantage_s": 0.0, "train_s": 1.5, "transfer_s": 0.1, "step_s": 2.2,
             "overlap_frac": 0.7} for s in range(3)]
    timing = run_figure(rows).axes[1]
    bars = [p for p in timing.patches if p.get_height() > 0]
    centers = sorted({round(p.get_x() + p.get_width() / 2, 2) for p in bars})
    assert centers == [-0.2, 0.2, 0.8, 1.2, 1.8, 2.2]
    tops = {round(p.get_x() + p.get_width() / 2, 2): p.get_y() + p.get_height() for p in bars}
    assert max(tops.values()) == pytest.approx(2.1)  # no bar sums both sides
    wall = [c for c in timing.collections if c.get_label().startswith("step_s")]
    assert wall and [seg[0][1] for seg in wall[0].get_segments()] == pytest.approx([2.2] * 3)


def test_a_run_sweep_plots_against_the_swept_key(tmp_path):
    rows = [{"overrides": f"+experiment=arith_co run.seed={s}", "measured_step_s": 1.0 + s,
             "predicted_step_s": 1.0} for s in (2, 0, 1)]
    key, values, labels = swept(rows)
    assert (key, values, labels) == ("run.seed", [2.0, 0.0, 1.0], ["2", "0", "1"])
    rows = [{"overrides": o, "measured_step_s": 1.0, "predicted_step_s": 1.0}
            for o in ("mesh.hosts=2 run.seed=0", "mesh.hosts=3 run.seed=1")]
    key, values, labels = swept(rows)
    assert key == "mesh.hosts, run.seed" and values is None
    assert plot_sweep(rows, key, "measured_step_s", "predicted_step_s", tmp_path / "s.png",
                      labels=labels).exists()

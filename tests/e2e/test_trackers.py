"""`run.loggers`: wandb (offline) and MLflow (SQLite) receive the parameters and every metrics
row of a 3-step run, a resume continues the same tracker runs, a missing extra is one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import warm
from paths import ROOT
from shared_runs import run_env

SHORT = ["+experiment=arith_co", "algorithm.sft_warmup_steps=2", "run.eval_every=0",
         "run.checkpoint_every=0"]
LOGGERS = "run.loggers=[jsonl,tensorboard,wandb,mlflow]"


def _run(run_dir: Path, *overrides: str, env_extra=None) -> subprocess.CompletedProcess:
    env = run_env()
    env |= {"WANDB_SILENT": "true", "WANDB_MODE": "offline"} | (env_extra or {})
    return warm.run([sys.executable, "-m", "locojax", *SHORT, f"hydra.run.dir={run_dir}",
                     *overrides], capture_output=True, text=True, timeout=600, cwd=ROOT,
                    env=env)


def _mlflow(run_dir: Path):
    from mlflow.tracking import MlflowClient

    ids = json.loads((run_dir / "trackers.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    return client, ids["mlflow"]


def _wandb_records(path: Path):
    """The protobuf records of a .wandb file (LevelDB-style log: a 7-byte file header, 32 KiB
    blocks, each record chunk a 7-byte header of crc, little-endian length and type)."""
    data, pos, block, pending = path.read_bytes(), 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # a full record, or the last chunk of one
            yield pending
            pending = b""


def _wandb_history(run_dir: Path) -> list[dict]:
    """The offline runs' logged rows, read back from their .wandb files."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for data in _wandb_records(path):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(data)
            if rec.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                             for i in rec.history.item})
    return rows


def test_wandb_offline_and_mlflow_sqlite_read_back_then_resume(tmp_path):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    out = _run(tmp_path, "run.steps=3", LOGGERS, "run.wandb.tags=[t1]",
               "run.mlflow.experiment=trk")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "warning: run.loggers" not in out.stderr, out.stderr[-2000:]
    client, run_id = _mlflow(tmp_path)
    run = client.get_run(run_id)
    assert run.data.params["workload.group_size"] == "16"
    assert run.data.params["run.steps"] == "3"
    steps = [m.step for m in client.get_metric_history(run_id, "reward_mean")]
    assert steps == [0, 1, 2]
    arts = {a.path for a in client.list_artifacts(run_id)}
    assert "plan.json" in arts
    wid = json.loads((tmp_path / "trackers.json").read_text())["wandb"]
    first = list((tmp_path / "wandb").glob(f"offline-run-*-{wid}"))
    assert first, sorted(p.name for p in (tmp_path / "wandb").iterdir())
    hist = _wandb_history(tmp_path)
    assert [h["_step"] for h in hist] == [0, 1, 2] and all("reward_mean" in h for h in hist)

    again = _run(tmp_path, "run.steps=5", LOGGERS, "run.mlflow.experiment=trk")
    assert again.returncode == 0, again.stderr[-3000:]
    client, run_id2 = _mlflow(tmp_path)
    assert run_id2 == run_id, "the resume opened a new MLflow run"
    steps = [m.step for m in client.get_metric_history(run_id, "reward_mean")]
    assert steps == [0, 1, 2, 3, 4]
    assert len(client.search_runs([run.info.experiment_id])) == 1
    assert json.loads((tmp_path / "trackers.json").read_text())["wandb"] == wid
    assert {h["_step"] for h in _wandb_history(tmp_path)} >= {0, 1, 2, 3, 4}


def test_a_missing_extra_is_one_line(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import importlib.util as u\n_f = u.find_spec\n"
        "u.find_spec = lambda n, *a: None if n == 'mlflow' else _f(n, *a)\n")
    env = {"PYTHONPATH": os.pathsep.join([str(shim), str(ROOT)])}
    out = _run(tmp_path / "run", "run.steps=1", "run.loggers=[jsonl,mlflow]", env_extra=env)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'locojax[mlflow]'" in lines[0], lines

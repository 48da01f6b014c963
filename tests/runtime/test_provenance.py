"""The first lines of a run say where its weights, dtypes and data come from, and the run
directory keeps it (`provenance.json`); a published model's architecture without a checkpoint
warns once; `model.dtype` unset is float32 on CPU and bfloat16 on accelerators."""

from __future__ import annotations

import json
import shutil

import pytest
from paths import DATA, FIXTURES

from compiler import compile_plan
from compiler.config import DType
from locojax.config.compose import compose_config
from locojax.runtime.rundir.provenance import announce, fingerprint

CHECKPOINT = FIXTURES / "tiny_qwen3"


def _plan(*overrides: str):
    return compile_plan(compose_config(["mesh=cpu", *overrides]))


def test_a_fresh_run_says_random_initialisation_the_cpu_dtype_and_generated_data(tmp_path,
                                                                                  capsys):
    announce(_plan("+experiment=arith_co"), tmp_path)
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "weights: random initialisation (run.seed=0): no model.checkpoint",
        "dtypes: compute float32 (the cpu default: bf16 matmuls are ~12x slower on CPU; "
        "model.dtype), master weights float32 (model.param_dtype)",
        "data: arith, generated in code (run.seed=0): nothing read or downloaded"]
    assert err == ""  # the tiny entry is no published model: nothing to warn about
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["checkpoint"] is None and record["weights"].startswith("random")


def test_a_paper_experiment_without_a_checkpoint_warns_once(tmp_path, capsys):
    plan = _plan("+experiment=gsm8k_co", f"workload.data_dir={DATA / 'gsm8k'}")
    announce(plan, tmp_path)
    out, err = capsys.readouterr()
    assert f"data: gsm8k from {DATA / 'gsm8k' / 'train.jsonl'} (workload.data_dir)" in out
    assert err.count("warning:") == 1 and "model=qwen3_0_6b has no model.checkpoint" in err
    assert "random weights" in err and "model=hf model.checkpoint=<HF dir>" in err
    (tmp_path / "checkpoints" / "5").mkdir(parents=True)  # a resume: said once was enough
    announce(plan, tmp_path)
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines()[0] == (
        f"weights: the run's checkpoint of step 5 ({tmp_path / 'checkpoints' / '5'}), resumed; "
        "the run started from random initialisation (run.seed=0): no model.checkpoint")


def test_a_user_task_names_its_data_files(tmp_path, capsys):
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"prompt": "ab", "target": "ba"}\n')
    announce(_plan("+experiment=arith_co", "workload=custom",
                   f"+workload.data_files.train={rows}", "+workload.data_files.eval=org/name"),
             tmp_path)
    out, _ = capsys.readouterr()
    assert f"data: custom from train: {rows}, eval: org/name (workload.data_files)" in out, out


def test_a_checkpoint_is_named_with_its_fingerprint(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(CHECKPOINT, ckpt)
    plan = _plan("+experiment=arith_co", "model=hf", f"model.checkpoint={ckpt}")
    assert plan.model.config.dtype == DType.float32  # model=hf on CPU: fp32 compute
    (tmp_path / "run").mkdir()
    announce(plan, tmp_path / "run")
    mark = fingerprint(ckpt)
    assert capsys.readouterr().out.splitlines()[0] == (
        f"weights: {ckpt} (model.checkpoint, fingerprint {mark})")
    assert json.loads((tmp_path / "run" / "provenance.json").read_text())["fingerprint"] == mark
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of a sampled block
    weights.write_bytes(bytes(data))
    assert fingerprint(ckpt) != mark and fingerprint(CHECKPOINT) == mark


@pytest.mark.parametrize("mesh,dtype", [(["mesh=cpu"], DType.float32),
                                        (["mesh=v7x", "mesh.chips=8"], DType.bfloat16)])
def test_an_unset_model_dtype_is_the_platforms(mesh, dtype):
    cfg = compose_config(["+experiment=gsm8k_co", "model=hf", f"model.checkpoint={CHECKPOINT}",
                          *mesh])
    assert cfg.model.dtype == dtype
    set_dtype = compose_config(["+experiment=gsm8k_co", *mesh, "model.dtype=float32"])
    assert set_dtype.model.dtype == DType.float32

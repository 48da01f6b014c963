"""Training from a Hugging Face checkpoint, end to end: an lr-0 step from `model=hf` exports
the checkpoint bit for bit (Qwen3; Qwen2 and Llama on 2 hosts), and the run's own Orbax
checkpoint wins over it on a rerun."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import warm
from paths import FIXTURES, ROOT
from safetensors.numpy import load_file
from shared_runs import run_env


def _run(run_dir: Path, *overrides: str, checkpoint: Path = FIXTURES / "tiny_qwen3"
         ) -> subprocess.CompletedProcess:
    env = run_env()
    cmd = [sys.executable, "-m", "locojax", "+experiment=arith_co", "model=hf",
           f"model.checkpoint={checkpoint}", "model.tokenizer=char",
           "model.dtype=float32", "algorithm.sft_warmup_steps=0", "run.eval_every=0",
           f"hydra.run.dir={run_dir}", *overrides]
    return warm.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def test_an_lr0_step_from_the_checkpoint_exports_it_bit_for_bit_and_resume_wins(tmp_path):
    same = ("algorithm.learning_rate=0", "algorithm.weight_decay=0", "model.export_dtype=float32",
            "run.checkpoint_every=1")
    out = _run(tmp_path, *same, "run.steps=1")
    assert out.returncode == 0, out.stderr[-3000:]
    first = out.stdout.splitlines()[0]  # where the weights come from, with their fingerprint
    assert first.startswith(f"weights: {FIXTURES / 'tiny_qwen3'} (model.checkpoint, "
                            "fingerprint "), first
    ours = load_file(tmp_path / "hf" / "model.safetensors")
    theirs = load_file(FIXTURES / "tiny_qwen3" / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for name, x in theirs.items():
        assert ours[name].dtype == x.dtype and ours[name].shape == x.shape, name
        assert ours[name].tobytes() == x.tobytes(), name
    # The run's own Orbax checkpoint wins over model.checkpoint on a rerun, in one line (the
    # same settings: a resume may change run.steps, not the recorded configuration).
    again = _run(tmp_path, *same, "run.steps=2")
    assert again.returncode == 0, again.stderr[-3000:]
    said = [line for line in (again.stdout + again.stderr).splitlines()
            if line.startswith("resumed")]
    assert said == [f"resumed from the checkpoint of step 1 (it wins over model.checkpoint="
                    f"{FIXTURES / 'tiny_qwen3'}, which is not read)"]
    assert again.stdout.splitlines()[0].startswith(
        f"weights: the run's checkpoint of step 1 ({tmp_path / 'checkpoints' / '1'}), resumed; "
        f"the run started from {first.removeprefix('weights: ')}")


def _rope_types(rope: dict) -> dict:
    """config.json's RoPE type, per layer kind where it has them (Gemma 3 in 5.x)."""
    if "rope_type" in rope:
        return {"": rope["rope_type"]}
    return {kind: r["rope_type"] for kind, r in rope.items()}


@pytest.mark.parametrize("fixture", ["tiny_qwen2", "tiny_llama", "tiny_gemma3"])
def test_each_family_trains_on_two_hosts_and_exports_its_own_checkpoint(fixture, tmp_path):
    """Qwen2 (q/k/v biases), Llama (llama3 RoPE scaling, tied) and Gemma 3 (sliding layers,
    four norms, GeGLU): 2 CO steps on 2 emulated hosts at lr 0 export the checkpoint bit for
    bit, as a config.json of the same family."""
    ckpt = FIXTURES / fixture
    out = _run(tmp_path, "algorithm.learning_rate=0", "algorithm.weight_decay=0",
               "model.export_dtype=float32", "run.steps=2", "mesh=cpu", "mesh.hosts=2",
               checkpoint=ckpt)
    assert out.returncode == 0, out.stderr[-3000:]
    ours = load_file(tmp_path / "hf" / "model.safetensors")
    theirs = load_file(ckpt / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for name, x in theirs.items():
        assert ours[name].tobytes() == x.tobytes(), name
    config, want = (json.loads((d / "config.json").read_text()) for d in (tmp_path / "hf", ckpt))
    for key in ("model_type", "architectures", "tie_word_embeddings", "num_attention_heads"):
        assert config[key] == want[key], key
    assert _rope_types(config["rope_parameters"]) == _rope_types(want["rope_parameters"])

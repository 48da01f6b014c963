"""`python -m locojax.sample` on bad prompts and bad checkpoints: one error line, exit 2."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import warm
from paths import FIXTURES, ROOT
from safetensors.numpy import load_file, save_file

FIXTURE = FIXTURES / "tiny_qwen3"
TINY = ["model=tiny", "model.tokenizer=char", "model.vocab=32", "model.num_layers=1",
        "sampling.temperature=0", "sampling.max_new_tokens=4"]


def _sample(*overrides: str, stdin: bytes | None = b"") -> subprocess.CompletedProcess:
    return warm.run([sys.executable, "-m", "locojax.sample", *overrides],
                    input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                    capture_output=True, timeout=300, cwd=ROOT)


def _one_line(out: subprocess.CompletedProcess) -> str:
    err = out.stderr.decode()
    assert out.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert out.stdout == b""
    return lines[0]


def test_prompt_past_max_position(tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("3+5=" * 40)
    line = _one_line(_sample(*TINY, "model.max_position=64", stdin=prompt.read_bytes()))
    assert line == ("error: prompt: 160 tokens + sampling.max_new_tokens=4 = 164 exceeds the "
                    "model's max_position=64")


def test_prompt_needing_more_memory_than_is_free():
    line = _one_line(_sample(*TINY, "model.max_position=400000", stdin=b"1" * 150_000))
    assert line.startswith("error: prompt: 150000 tokens need about ") and "GiB are free" in line


def test_stdin_not_utf8():
    line = _one_line(_sample(*TINY, stdin=b"3+5=\xff\xfe\x80"))
    assert line == "error: prompt: standard input is not UTF-8 (byte 0xff at offset 4)"


def test_stdin_closed():
    out = warm.run(f"{sys.executable} -m locojax.sample {' '.join(TINY)} <&-", shell=True,
                   capture_output=True, timeout=300)
    assert _one_line(out).startswith("error: prompt: empty and standard input is closed")


def _broken(tmp_path: Path, change) -> Path:
    ckpt = Path(shutil.copytree(FIXTURE, tmp_path / "ckpt"))
    tensors = load_file(ckpt / "model.safetensors")
    change(tensors)
    save_file(tensors, ckpt / "model.safetensors")
    return ckpt


@pytest.mark.parametrize("change,want", [
    (lambda t: t.pop("model.layers.0.mlp.down_proj.weight"),
     "tensor model.layers.0.mlp.down_proj.weight is missing (expected shape (64, 128))"),
    (lambda t: t["model.norm.weight"].__setitem__(0, np.inf),
     "tensor model.norm.weight has 1 non-finite values"),
])
def test_broken_checkpoint(tmp_path, change, want):
    ckpt = _broken(tmp_path, change)
    line = _one_line(_sample(f"model.checkpoint={ckpt}", "model.tokenizer=char", "prompt='3+5='"))
    assert want in line and str(ckpt) in line

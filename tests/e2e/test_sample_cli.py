"""`python -m locojax.sample`: greedy output equals transformers, stdin prompts, clear errors."""

import json
import subprocess
import sys

import warm
from paths import FIXTURES

FIXTURE = FIXTURES / "tiny_qwen3"


def _sample(*overrides: str, stdin: str = "") -> subprocess.CompletedProcess:
    return warm.run(
        [sys.executable, "-m", "locojax.sample", *overrides],
        input=stdin, capture_output=True, text=True, timeout=300,
    )


def test_greedy_ids_equal_transformers_generate():
    ref = json.loads((FIXTURE / "cli_greedy.json").read_text())
    out = _sample(f"model.checkpoint={FIXTURE}", "model.tokenizer=char",
                  f"prompt='{ref['prompt']}'", "sampling.temperature=0",
                  f"sampling.max_new_tokens={len(ref['greedy_ids'])}", "output=ids")
    assert out.returncode == 0, out.stderr
    assert [int(t) for t in out.stdout.split()] == ref["greedy_ids"]


def test_prompt_from_stdin_and_only_the_completion_on_stdout():
    ref = json.loads((FIXTURE / "cli_greedy.json").read_text())
    out = _sample(f"model.checkpoint={FIXTURE}", "model.tokenizer=char", "sampling.temperature=0",
                  "sampling.max_new_tokens=4", "output=ids", stdin=ref["prompt"])
    assert out.returncode == 0, out.stderr
    assert [int(t) for t in out.stdout.split()] == ref["greedy_ids"][:4]


def test_random_tiny_model_prints_a_completion():
    out = _sample("model=tiny", "model.tokenizer=char", "model.vocab=32", "prompt='2+3='",
                  "sampling.temperature=0", "sampling.max_new_tokens=8")
    assert out.returncode == 0, out.stderr
    assert out.stdout.endswith("\n")


def test_missing_checkpoint_is_one_error_line(tmp_path):
    out = _sample(f"model.checkpoint={tmp_path / 'nope'}", "prompt='hi'")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model.checkpoint=")
    assert out.stdout == ""

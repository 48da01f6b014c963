"""The work of `python -m locojax.eval`: a checkpoint's k completions per prompt, scored.

    eval.checkpoint (HF dir, or a run dir's hf/) ──compile_plan──> the plan's host 0
        ──load_hf_checkpoint, rollout_params──> the rollout weights (as a run places them)
        ──eval_samples (the in-run evaluation's code)──> EvalSamples ──> samples.jsonl,
        summary.json, the summary dict

One process scores the whole split (`mesh=auto` sees this machine's devices). On a cluster,
run it on one host (each host evaluating its own `eval.out` works too, but they do not join).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from compiler import compile_plan
from locojax.config.compose import EvalSplit
from locojax.config.resolve import detected_topology
from locojax.model import CheckpointError, load_hf_checkpoint
from locojax.runtime.components import build_host
from locojax.runtime.episode import EVAL_STREAM, eval_samples, step_key
from locojax.runtime.errors import UserError
from locojax.runtime.evaluation import EvalSamples
from locojax.runtime.rundir.files import HF_DIR, PLAN_FILE
from locojax.runtime.weights import rollout_params

SAMPLES_FILE = "samples.jsonl"
SUMMARY_FILE = "summary.json"


def checkpoint_of(path: str) -> tuple[Path, Path]:
    """(the HF directory, the default output directory) of `eval.checkpoint`."""
    if not path:
        raise UserError("eval.checkpoint: empty; pass an HF directory or a run directory")
    where = Path(path).expanduser()
    if (where / PLAN_FILE).is_file():
        if not (where / HF_DIR / "config.json").is_file():
            raise UserError(f"eval.checkpoint={path}: a run directory without its exported "
                            f"policy ({where / HF_DIR}); finish the run (the same command "
                            "resumes it) or pass an HF directory")
        return where / HF_DIR, where / "eval"
    if not (where / "config.json").is_file():
        raise UserError(f"eval.checkpoint={path}: neither an HF directory (no config.json) "
                        f"nor a run directory (no {PLAN_FILE})")
    return where, Path("eval")


def write_rows(out: Path, problems, result: EvalSamples) -> None:
    """One JSON line per prompt: its question, reference answer, completions and scores."""
    with open(out / SAMPLES_FILE, "w", encoding="utf-8") as f:
        for p, texts, ok, n, cut in zip(problems, result.texts, result.correct_PxK,
                                        result.lengths_PxK, result.truncated_PxK, strict=True):
            f.write(json.dumps({"question": p.question, "answer": p.answer,
                                "completions": texts, "correct": [bool(x) for x in ok],
                                "lengths": [int(x) for x in n],
                                "truncated": [bool(x) for x in cut]}) + "\n")


def evaluate(cfg) -> dict:
    """Sample `cfg.eval.samples` completions of each prompt of the split, score them, write
    the rows and the summary; the summary."""
    opts = cfg.eval
    if opts.samples < 1 or opts.prompts < 0:
        raise UserError(f"eval.samples={opts.samples} must be >= 1 and eval.prompts="
                        f"{opts.prompts} >= 0")
    hf_dir, default_out = checkpoint_of(opts.checkpoint)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model,
                                                             checkpoint=str(hf_dir)))
    plan = compile_plan(cfg, detected_topology(cfg))
    host = build_host(plan, 0)
    try:
        _, loaded = load_hf_checkpoint(hf_dir)
    except CheckpointError as err:
        raise UserError(str(err)) from err
    params = rollout_params(host, loaded)
    pool = host.workload.eval if opts.split == EvalSplit.eval else host.workload.train
    problems = list(pool[:opts.prompts or plan.workload.eval_prompts])
    key = step_key(plan.run.seed, 0, EVAL_STREAM)
    result = eval_samples(host, params, problems, key, opts.samples)
    host.scorer.close()
    out = Path(opts.out) if opts.out else default_out
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out, problems, result)
    summary = result.summary().as_row() | {"split": str(opts.split),
                                           "checkpoint": str(hf_dir)}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    return summary

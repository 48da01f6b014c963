"""The work of `python -m locojax.eval`: a checkpoint's k completions per prompt, scored.

    eval.checkpoint (HF dir; a run dir: its latest checkpoint step, else its hf/)
        ──compile_plan (a run dir's step: the run's own model entry)──> the plan
        ──build_host(this host), load_hf_checkpoint or the step's fp32 master params
          (`restored`), rollout_params──> the rollout weights
        ──this host's blocks of prompts (`share`), eval_samples (the in-run evaluation's
          code)──> rows ──all_gather_text──> host 0: samples.jsonl, summary.json, the summary

The same command on every host of a cluster (or `mesh=cpu mesh.hosts=N`, emulated here)
shares the prompts: each host samples and scores its own blocks, host 0 writes every row.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from compiler.plan import ExecutionPlan
from locojax.config.compose import EvalSplit
from locojax.episodes.keys import StepKeys
from locojax.eval.restore import Source, model_of, restored, run_source
from locojax.eval.share import host_blocks, merged, rows_of, samples_of, take
from locojax.model import CheckpointError, load_hf_checkpoint
from locojax.runtime.components import build_host
from locojax.runtime.episode import eval_samples
from locojax.runtime.errors import UserError
from locojax.runtime.process.distributed import all_gather_text
from locojax.runtime.rundir.files import PLAN_FILE
from locojax.runtime.weights import rollout_params

SAMPLES_FILE = "samples.jsonl"
SUMMARY_FILE = "summary.json"
GATHER_TIMEOUT_S = 24 * 3600
"""How long host 0 waits for the others' rows (a host that dies stops the job sooner)."""


def checkpoint_of(path: str, step: int = 0) -> Source:
    """What `eval.checkpoint` (and `eval.step`) name: a run directory's checkpoint step (the
    latest unless `step`), else its `hf/` export, else an HF directory."""
    if not path:
        raise UserError("eval.checkpoint: empty; pass an HF directory or a run directory")
    where = Path(path).expanduser()
    if (where / PLAN_FILE).is_file():
        return run_source(where, step, path)
    if step:
        raise UserError(f"eval.step={step}: only a run directory has steps (eval.checkpoint="
                        f"{path} is not one)")
    if not (where / "config.json").is_file():
        raise UserError(f"eval.checkpoint={path}: neither an HF directory (no config.json) "
                        f"nor a run directory (no {PLAN_FILE})")
    return Source(where, Path("eval"))


def checked(cfg):
    """`cfg` with the model of `eval.checkpoint` (an HF directory's config.json, or a run
    step's recorded model entry; bad options: one line), and the checkpoint's `Source`."""
    opts = cfg.eval
    if opts.samples < 1 or opts.prompts < 0 or opts.step < 0:
        raise UserError(f"eval.samples={opts.samples} must be >= 1, eval.prompts="
                        f"{opts.prompts} >= 0 and eval.step={opts.step} >= 0")
    source = checkpoint_of(opts.checkpoint, opts.step)
    if source.step is not None:
        return dataclasses.replace(cfg, model=model_of(source, cfg.model)), source
    model = dataclasses.replace(cfg.model, checkpoint=str(source.path))
    return dataclasses.replace(cfg, model=model), source


def _weights(host, source: Source):
    """The checkpoint's parameters: an HF directory's as stored, a run step's fp32 master."""
    if source.step is not None:
        return restored(host, source)
    try:
        return load_hf_checkpoint(source.path)[1]
    except CheckpointError as err:
        raise UserError(str(err)) from err


def write_rows(out: Path, problems, rows: list[dict]) -> None:
    """One JSON line per prompt: its question, reference answer, completions, scores and the
    host that evaluated it."""
    with open(out / SAMPLES_FILE, "w", encoding="utf-8") as f:
        for p, r in zip(problems, rows, strict=True):
            f.write(json.dumps({"question": p.question, "answer": p.answer,
                                **{k: v for k, v in r.items() if k != "index"}}) + "\n")


def evaluate(cfg, plan: ExecutionPlan, source: Source, host_index: int = 0,
             hosts: int = 1) -> dict | None:
    """Sample `cfg.eval.samples` completions of each of this host's prompts, score them,
    gather every host's rows; host 0 writes the rows and the summary and returns the summary
    (the others None)."""
    opts = cfg.eval
    host = build_host(plan, host_index, trains=hosts == 1)
    params = rollout_params(host, _weights(host, source))
    pool = host.data.workload.eval if opts.split == EvalSplit.eval else host.data.workload.train
    problems = list(pool[:opts.prompts or plan.workload.eval_prompts])
    keys = StepKeys(plan.run.seed, 0)
    mine: list[dict] = []
    for b, first, end in host_blocks(len(problems), host_index, hosts):
        block = problems[first:end]
        size = host_blocks(len(problems), 0, 1)[0][2]  # every block sampled at full size
        padded = [*block, *[block[0]] * (size - len(block))]
        result = eval_samples(host, params, padded, keys.evaluation(b), opts.samples)
        mine += rows_of(take(result, len(block)), first, host_index)
    host.close()
    texts = all_gather_text(f"eval/{plan.run.seed}", json.dumps(mine), GATHER_TIMEOUT_S)
    if host_index != 0:
        return None
    rows = merged(texts, len(problems))
    out = Path(opts.out) if opts.out else source.out
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out, problems, rows)
    summary = samples_of(rows, opts.samples).summary().as_row() | {
        "split": str(opts.split), "checkpoint": str(source.path), **source.step_key(), "hosts": hosts}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    return summary

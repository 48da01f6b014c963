"""A run directory's checkpoint step as the weights `python -m locojax.eval` scores.

    <run dir>/checkpoints/<step>/ (the latest, or eval.step) ──plan.json's model entry──> the
        architecture ──Checkpointer.restore(params only)──> the policy's master weights
        (model.param_dtype), placed in the rollout layout; `rollout_params` casts them as it
        casts the weights a run samples with

A run directory without a committed step is evaluated through its `hf/` export; with
neither, `eval.checkpoint` is one line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import jax

from compiler.config import ModelConfig, TokenizerKind
from locojax.model import abstract_model
from locojax.runtime.components import Host, rollout_shardings
from locojax.runtime.errors import UserError
from locojax.runtime.rundir.checkpoint import Checkpointer
from locojax.runtime.rundir.files import CHECKPOINTS_DIR, HF_DIR, load_plan


@dataclass(frozen=True)
class Source:
    """Where the evaluated weights come from."""

    path: Path
    """An HF directory, or a run's step directory (`<run dir>/checkpoints/<step>`)."""
    out: Path
    """The default output directory (`eval.out` empty)."""
    run_dir: Path | None = None
    """The run directory of a checkpoint step (None: an HF directory)."""
    step: int | None = None
    """The checkpoint step evaluated (None: an HF directory)."""

    def step_key(self) -> dict[str, int]:
        """The summary's `step` key, when a step is evaluated."""
        return {} if self.step is None else {"step": self.step}


def saved_steps(run_dir: Path) -> list[int]:
    """The committed checkpoint steps of a run directory, oldest first (Orbax names a
    committed step's directory by its number; an unfinished save is a tmp directory)."""
    where = run_dir / CHECKPOINTS_DIR
    if not where.is_dir():
        return []
    return sorted(int(p.name) for p in where.iterdir() if p.is_dir() and p.name.isdigit())


def run_source(run_dir: Path, step: int, given: str) -> Source:
    """A run directory's latest committed step (or `step`), else its `hf/` export."""
    steps = saved_steps(run_dir)
    if steps:
        if step and step not in steps:
            raise UserError(f"eval.step={step}: {run_dir / CHECKPOINTS_DIR} holds steps "
                            f"{', '.join(map(str, steps))}")
        chosen = step or steps[-1]
        return Source(run_dir / CHECKPOINTS_DIR / str(chosen), run_dir / "eval", run_dir, chosen)
    if step:
        raise UserError(f"eval.step={step}: {run_dir} holds no checkpoint")
    if not (run_dir / HF_DIR / "config.json").is_file():
        raise UserError(f"eval.checkpoint={given}: a run directory with neither a checkpoint "
                        f"({run_dir / CHECKPOINTS_DIR}) nor its exported policy "
                        f"({run_dir / HF_DIR}); pass an HF directory")
    return Source(run_dir / HF_DIR, run_dir / "eval")


def model_of(source: Source, model: ModelConfig) -> ModelConfig:
    """The run's own model entry (its plan.json), its numbers as recorded; the compute dtype
    is the evaluation's (`model.dtype`), as for an HF directory. The run's base checkpoint is
    kept only where the tokenizer is read from it."""
    run = load_plan(source.run_dir).model.config
    base = run.checkpoint if run.tokenizer == TokenizerKind.checkpoint else None
    return dataclasses.replace(run, from_checkpoint=False, checkpoint=base, dtype=model.dtype)


def restored(host: Host, source: Source):
    """The policy's master parameters of `source.step`, on this host's rollout layout (only
    the parameters are read, not the optimizer state)."""
    abstract = abstract_model(host.arch)[1]
    like = jax.tree.map(lambda x, sharding: jax.ShapeDtypeStruct(x.shape, host.param_dtype,
                                                                 sharding=sharding),
                        abstract, rollout_shardings(host, abstract))
    with Checkpointer(source.path.parent, async_save=False, read_only=True) as ckpt:
        try:
            return ckpt.restore(source.step, like, {})[0]
        except Exception as err:  # Orbax and tensorstore raise many types for bad files
            lines = [x.strip() for x in str(err).splitlines() if x.strip()]
            raise UserError(f"eval.checkpoint={source.run_dir}: step {source.step} does not "
                            f"restore ({type(err).__name__}: {lines[0] if lines else ''})"
                            ) from err

"""A run directory's checkpoint step as the weights `python -m locojax.eval` scores.

    <run dir>/checkpoints/<step>/ (the latest, or eval.step) ──plan.json's model entry──> the
        architecture ──Checkpointer.restore(params only)──> the policy's master weights
        (model.param_dtype), placed in the rollout layout; `rollout_params` casts them as it
        casts the weights a run samples with
    a LoRA run (plan.json's algorithm.lora.rank > 0): the step holds the adapters only
        ──restore adapters──> + the run's frozen base (its reference/ save when the warm-up
        trained it, else its model.checkpoint, else the init of its run.seed), checked against
        the fingerprint the step recorded ──W + (alpha / r) A B──> the policy

A run directory without a committed step is evaluated through its `hf/` export; with
neither, `eval.checkpoint` is one line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from compiler.config import ModelConfig, TokenizerKind
from compiler.plan import ExecutionPlan
from locojax.model import abstract_model, load_hf_checkpoint
from locojax.model.lora import LoraSpec, abstract_adapters, merged
from locojax.runtime.adapters import BASE_FINGERPRINT, fingerprint
from locojax.runtime.assemble import lora_spec
from locojax.runtime.components import Host, rollout_shardings
from locojax.runtime.errors import UserError
from locojax.runtime.rundir.checkpoint import Checkpointer
from locojax.runtime.rundir.files import CHECKPOINTS_DIR, HF_DIR, REFERENCE_DIR, load_plan
from locojax.runtime.trained import params_structs, warms_base_of
from locojax.runtime.weights import seed_init


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


def _params_like(host: Host, dtype: str):
    """The model's parameters as `dtype` structs on this host's rollout layout."""
    abstract = abstract_model(host.model.arch)[1]
    return params_structs(abstract, dtype, rollout_shardings(host, abstract))


def _restore(directory: Path, step: int, like, what: str) -> tuple:
    """(params, meta) of `step` in `directory`; a file that does not restore is one line."""
    with Checkpointer(directory, async_save=False, read_only=True) as ckpt:
        try:
            params, _, meta = ckpt.restore(step, like, {})
            return params, meta
        except Exception as err:  # Orbax and tensorstore raise many types for bad files
            lines = [x.strip() for x in str(err).splitlines() if x.strip()]
            raise UserError(f"eval.checkpoint={what}: step {step} of {directory} does not "
                            f"restore ({type(err).__name__}: {lines[0] if lines else ''})"
                            ) from err


def _lora_base(host: Host, run: ExecutionPlan, run_dir: Path):
    """The frozen base a LoRA run trained its adapters on, in its compute dtype."""
    dtype = host.model.compute_dtype
    if warms_base_of(run.algorithm) and (run_dir / REFERENCE_DIR).is_dir():
        return _restore(run_dir / REFERENCE_DIR, 0, _params_like(host, dtype), str(run_dir))[0]
    if run.model.config.checkpoint:
        return load_hf_checkpoint(run.model.config.checkpoint, dtype=dtype)[1]
    return jax.jit(partial(seed_init, host.model.arch, run.run.seed, dtype))()


def _lora_policy(host: Host, source: Source, run: ExecutionPlan, spec: LoraSpec):
    """The step's adapters merged onto the run's base, in the master dtype."""
    whole = NamedSharding(host.model.rollout_mesh, PartitionSpec())
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=whole),
                        abstract_adapters(host.model.arch, spec))
    adapters, meta = _restore(source.path.parent, source.step, like, str(source.run_dir))
    base = _lora_base(host, run, source.run_dir)
    saved = meta.get(BASE_FINGERPRINT)
    if saved is not None and saved != fingerprint(base):
        raise UserError(f"eval.checkpoint={source.run_dir}: the adapters of step "
                        f"{source.step} were trained on another base than the run's "
                        f"model.checkpoint gives now ({run.model.config.checkpoint})")
    return merged(base, adapters, spec, jnp.dtype(host.model.param_dtype))


def restored(host: Host, source: Source):
    """The policy's master parameters of `source.step`, on this host's rollout layout (only
    the parameters are read, not the optimizer state); a LoRA run's base with the step's
    adapters merged."""
    run = load_plan(source.run_dir)
    spec = lora_spec(run.algorithm)
    if spec is not None:
        return _lora_policy(host, source, run, spec)
    like = _params_like(host, host.model.param_dtype)
    return _restore(source.path.parent, source.step, like, str(source.run_dir))[0]

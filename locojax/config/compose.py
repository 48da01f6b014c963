"""Hydra glue: registers the schema, composes `conf/`, and turns the result into typed objects.

This is the only place (with the entry points) that touches Hydra and OmegaConf. The schema
dataclasses are frozen; Hydra cannot merge YAML into read-only nodes, so each schema is stored
as a structured node with its read-only flags cleared. `OmegaConf.to_object` then builds the
frozen dataclasses, so an unknown or mistyped key fails at compose time.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, ListConfig, OmegaConf

from compiler.config import Config
from compiler.errors import ConfigKeyError
from compiler.model_entry import with_compute_dtype
from locojax.config.resolve import register_auto_hardware
from locojax.runtime.process.job import job_from_env

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
"""The repository's `conf/` tree."""


class OutputFormat(StrEnum):
    """How `python -m locojax.plan` prints the plan."""

    text = "text"
    """Rich tables: hosts and roles, meshes, sharding sample, transfer rounds, batch, cost."""
    json = "json"
    """The full plan as JSON on stdout, and nothing else."""


@dataclass(frozen=True)
class PlanAppConfig(Config):
    """`python -m locojax.plan`: the run configuration plus how to print the plan."""

    format: OutputFormat = OutputFormat.text
    """`text` or `json`."""
    aot: bool = False
    """Also compile the plan's programs with the TPU compiler for the plan's TPU slice (needs
    the `tpu` extra: libtpu) and print its memory, FLOPs and collectives beside the plan's."""


class SampleOutput(StrEnum):
    """What `python -m locojax.sample` prints."""

    text = "text"
    """The decoded completion."""
    ids = "ids"
    """The completion's token ids, space-separated."""


@dataclass(frozen=True)
class SampleAppConfig(Config):
    """`python -m locojax.sample`: the run configuration plus the prompt."""

    prompt: str = ""
    """Prompt text; empty reads it from standard input."""
    chat: bool = False
    """Wrap the prompt in the Qwen3 chat template (a user turn, then the assistant header)."""
    output: SampleOutput = SampleOutput.text
    """Print the completion text or its token ids."""


class EvalSplit(StrEnum):
    """Which of the workload's problems `python -m locojax.eval` scores."""

    eval = "eval"
    """The held-out problems (`workload.eval_split`)."""
    train = "train"
    """The training problems."""


@dataclass(frozen=True)
class EvalOptions:
    """`python -m locojax.eval`'s own keys (`eval.*`)."""

    checkpoint: str = ""
    """A Hugging Face directory, or a run directory (its latest checkpoint step; without
    one, its exported policy `<run dir>/hf`)."""
    step: int = 0
    """The run directory's checkpoint step to evaluate (0: the latest)."""
    split: EvalSplit = EvalSplit.eval
    """`eval` (held out) or `train`."""
    samples: int = 1
    """k completions per prompt: 1 decodes greedily, more sample at `sampling.temperature`."""
    prompts: int = 0
    """Prompts scored, the first of the split (0: `workload.eval_prompts`)."""
    out: str = ""
    """Directory for samples.jsonl and summary.json (empty: `<run dir>/eval` for a run
    directory, else `./eval`)."""


@dataclass(frozen=True)
class EvalAppConfig(Config):
    """`python -m locojax.eval`: the run configuration plus the evaluation's keys."""

    eval: EvalOptions = dataclasses.field(default_factory=EvalOptions)
    """Checkpoint, split, samples per prompt, prompts and output directory."""


SCHEMAS: dict[str, type[Config]] = {"run": Config, "plan": PlanAppConfig, "sample": SampleAppConfig,
                                    "eval": EvalAppConfig}


def _writable(node: DictConfig | ListConfig) -> DictConfig | ListConfig:
    """Clear the read-only flags that frozen dataclasses set, recursively."""
    node._set_flag("readonly", None)
    keys = range(len(node)) if isinstance(node, ListConfig) else node.keys()
    for key in keys:
        child = node._get_node(key)
        if OmegaConf.is_config(child):
            _writable(child)
        else:
            child._set_flag("readonly", None)
    return node


def register_schemas() -> None:
    """Store each entry point's schema as `schema/<name>` in Hydra's ConfigStore, and the
    `hardware/auto` entry of `mesh=auto` (`locojax.config.resolve`)."""
    store = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        store.store(group="schema", name=name, node=_writable(OmegaConf.structured(schema)),
                    package="_global_")
    register_auto_hardware(store, CONF_DIR)


def _unknown_key(node: DictConfig, prefix: str = "") -> str | None:
    """The first key under `node` its schema dataclass lacks, with the keys it has."""
    cls = OmegaConf.get_type(node)
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else None
    for key in node.keys():
        if names is not None and key not in names:
            where = prefix.rstrip(".") or "the config"
            return f"{prefix}{key}: no such key in {where}: {', '.join(names)}"
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            found = _unknown_key(child, f"{prefix}{key}.")
            if found:
                return found
    return None


def to_config(cfg: DictConfig) -> Any:
    """The frozen typed dataclass tree of a composed configuration; `ConfigKeyError` for a
    key the schema lacks (Hydra lets `+key=value` add one). `model.dtype: null` becomes the
    platform's compute dtype (`hardware.platform`, which `mesh=auto` has just resolved)."""
    unknown = _unknown_key(cfg)
    if unknown:
        raise ConfigKeyError(unknown)
    typed = OmegaConf.to_object(cfg)
    if isinstance(typed, Config):
        typed = dataclasses.replace(typed, model=with_compute_dtype(typed.model,
                                                                     typed.hardware.platform))
    return typed


def controller_config(cfg: DictConfig) -> Any:
    """The typed `controller` group alone. `python -m locojax` joins its job from it before
    `to_config` resolves the rest: `mesh=auto`'s hardware entry asks JAX for the devices, and
    no JAX call may come before `jax.distributed.initialize`."""
    unknown = _unknown_key(cfg.controller, "controller.")
    if unknown:
        raise ConfigKeyError(unknown)
    return OmegaConf.to_object(cfg.controller)


def compose_config(overrides: list[str] | tuple[str, ...] = (), config_name: str = "config",
                   conf_dir: Path = CONF_DIR) -> Any:
    """Compose `conf_dir` (default `conf/`) with Hydra's compose API (tests, scripts)."""
    register_schemas()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
        return to_config(compose(config_name=config_name, overrides=list(overrides)))


def _job(distributed: str, coordinator: str) -> tuple[str | None, int | None] | None:
    """(name, host index) of the multi-process job this process will join, or None."""
    if str(distributed) == "off":
        return None
    job = job_from_env(os.environ)
    if coordinator:
        return f"job-{coordinator.replace(':', '_')}", job.process_id if job else None
    if job is None or not job.multi_process:
        return None
    return job.job_name, job.process_id


def job_run_dir(distributed: str, coordinator: str, fallback: str) -> str:
    """`hydra.run.dir`'s default below outputs/: the job's name when this process is one host of
    a multi-process job (`slurm-<id>`, `ompi-<id>`, `job-<coordinator>`, ...), so the same
    command lands every host in one directory; `fallback` (date/time) otherwise."""
    job = _job(distributed, coordinator)
    return job[0] if job is not None and job[0] else fallback


def job_output_subdir(distributed: str, coordinator: str, host_index: int) -> str:
    """`hydra.output_subdir`: `.hydra` on host 0 (and alone), `.hydra-host<i>` on host i, so
    hosts sharing a run directory keep their own record of what they were started with."""
    job = _job(distributed, coordinator)
    index = host_index if host_index >= 0 else (job[1] if job else 0)
    if job is not None and index is None:
        return f".hydra-{os.uname().nodename}-{os.getpid()}"
    return ".hydra" if not index else f".hydra-host{index}"


def by_ratio_level(level: str, token: Any, sequence: Any) -> Any:
    """`${locojax.by_ratio_level:${.ratio_level},<token>,<sequence>}`: an algorithm default that
    depends on the ratio level (GSPO's clip range and aggregation, conf/algorithm/grpo.yaml);
    a value the user sets replaces the interpolation."""
    return sequence if str(level) == "sequence" else token


def register_resolvers() -> None:
    """`${locojax.job_run_dir:...}`, `${locojax.output_subdir:...}` (conf/config.yaml) and
    `${locojax.by_ratio_level:...}` (conf/algorithm/grpo.yaml)."""
    OmegaConf.register_new_resolver("locojax.by_ratio_level", by_ratio_level, replace=True)
    OmegaConf.register_new_resolver("locojax.job_run_dir", job_run_dir, replace=True,
                                    use_cache=True)
    OmegaConf.register_new_resolver("locojax.output_subdir", job_output_subdir, replace=True,
                                    use_cache=True)


register_schemas()
register_resolvers()

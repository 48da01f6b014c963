"""Everything one host needs to run the plan, built once at start-up from the plan alone.

    build_host(plan, i) -> Host
        plan, role                   which host this is
        model: ModelLayout           arch, graph, meshes, parameter/adapter/batch layouts
                                     (what the weights, the steps and the rollout copy need)
        tokenizer, sampling, greedy, engine, grpo     generation and training settings
        data: HostData | None        problems, prompt stream, reward scorer, episode workers
                                     (None on a host built to compile only)

The weights and the jitted steps belong to the trainer (`runtime/trainer.py`) and
`runtime/weights.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import gcd
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding

from compiler.axes import MeshAxis
from compiler.config import ModelConfig
from compiler.plan import ExecutionPlan
from locojax.data import PromptStream, Workload, load_workload
from locojax.data.stream import DataPosition
from locojax.model import ModelArch, Qwen3, split_params
from locojax.model.lora import LoraSpec, abstract_adapters
from locojax.rewards import Scorer
from locojax.rollout.engine import EngineOptions
from locojax.rollout.sampler import SamplingSettings
from locojax.runtime import assemble
from locojax.runtime.hostwork import host_cores
from locojax.runtime.turns import TurnSetup, turn_setup
from locojax.tokenizers import Tokenizer
from locojax.train import GrpoSettings, batch_sharding, param_shardings
from locojax.train.lora import adapter_shardings


@dataclass(frozen=True)
class HostRole:
    """Which host this process is."""

    index: int
    """Host index in the plan (the JAX process index)."""
    count: int
    """Hosts in the plan."""

    @property
    def is_primary(self) -> bool:
        """Writes metrics, checkpoints' metadata and the final export."""
        return self.index == 0


@dataclass(frozen=True)
class ModelLayout:
    """The model a host computes and where its weights and batches live: what the weights,
    the train steps, the adapters and the rollout copy need."""

    config: ModelConfig
    """The plan's model section (`plan.model.config`)."""
    arch: ModelArch
    graphdef: nnx.GraphDef
    train_mesh: Mesh
    rollout_mesh: Mesh
    param_shardings: Any
    """Layout of the parameters on the training mesh; None on a host that never trains."""
    batch_sharding: NamedSharding
    lora: LoraSpec | None = None
    """The adapters trained instead of the whole model (`algorithm.lora`; None: rank 0)."""
    adapter_shardings: Any = None
    """Layout of the adapters (and their moments) on the training mesh; None without LoRA."""

    @property
    def compute_dtype(self) -> str:
        """dtype of activations, of the rollout weights and of DA transfer slices."""
        return str(self.config.dtype)

    @property
    def param_dtype(self) -> str:
        """dtype of the master weights and both AdamW moments (`model.param_dtype`)."""
        return self.arch.param_dtype

    @property
    def checkpoint(self) -> Path | None:
        """The Hugging Face checkpoint training starts from (`model.checkpoint`), or None."""
        return assemble.checkpoint_dir(self.config)


@dataclass(frozen=True)
class HostData:
    """A host's problems and the workers of its host work: the reward scorer and, for
    multi-turn episodes, the environment and tool workers."""

    workload: Workload
    stream: PromptStream
    scorer: Scorer
    turns: TurnSetup | None = None
    """The environment and tool workers, turn format and limits (None: one prompt, one
    reply)."""

    def close(self) -> None:
        """Stop the worker processes (reward scorer, environments and tools)."""
        for workers in (self.scorer, self.turns):
            if workers is not None:
                workers.close()


@dataclass(frozen=True)
class Host:
    """One host's runtime objects: who it is, its model layout, its generation and training
    settings, and its data (None on a host built to compile only, `build_host(...,
    data=False)`)."""

    plan: ExecutionPlan
    role: HostRole
    model: ModelLayout
    tokenizer: Tokenizer
    sampling: SamplingSettings
    greedy: SamplingSettings
    engine: EngineOptions
    """The plan's slots, schedule, CPU kernels and KV dtype for every generation."""
    grpo: GrpoSettings
    data: HostData | None

    def close(self) -> None:
        """Stop the host's worker processes (reward scorer, environments and tools)."""
        if self.data is not None:
            self.data.close()

    def prompt_range(self) -> tuple[int, int]:
        """[start, stop) of each step's prompts this process samples."""
        r = self.plan.batch.prompt_ranges[self.role.index]
        return r.start, r.stop


def _per_host(sizes: tuple[int, ...], local: int) -> tuple[int, ...]:
    """How much of each mesh axis one host's `local` devices span, trailing axes first (FSDP
    within a host before data across hosts); the rest of each axis spans hosts."""
    within, left = [], local
    for size in reversed(sizes):
        within.insert(0, gcd(size, left))
        left //= within[0]
    if left != 1:
        raise RuntimeError(f"a mesh of {sizes} does not fill hosts of {local} devices")
    return tuple(within)


def _mesh(devices: list, shape: dict, names: tuple[str, ...]) -> Mesh:
    """Mesh of `devices` in the plan's shape; across processes each host owns a contiguous
    block of the trailing axes (its devices are never interleaved with another host's)."""
    sizes = tuple(int(shape[n]) for n in names)
    if int(np.prod(sizes)) != len(devices):
        raise RuntimeError(f"plan wants mesh {dict(zip(names, sizes, strict=True))} but this "
                           f"process sees {len(devices)} devices")
    hosts = {d.process_index for d in devices}
    if len(hosts) == 1:
        grid = mesh_utils.create_device_mesh(sizes, devices, allow_split_physical_axes=True)
    else:
        within = _per_host(sizes, len(devices) // len(hosts))
        across = tuple(s // w for s, w in zip(sizes, within, strict=True))
        grid = mesh_utils.create_hybrid_device_mesh(within, across, devices,
                                                    process_is_granule=True,
                                                    allow_split_physical_axes=True)
    return Mesh(grid, names, axis_types=(AxisType.Auto,) * len(names))


def build_meshes(plan: ExecutionPlan, role: HostRole, trains: bool,
                 devices: Sequence | None = None,
                 local: Sequence | None = None) -> tuple[Mesh, Mesh]:
    """Training mesh (data, fsdp) over every device of the training group, and this
    process's rollout mesh (replica, tensor); a process that never trains (a DA rollout
    actor) gets a local stand-in training mesh. `devices` / `local` (default: what this
    process sees, `jax.devices()` / `jax.local_devices()`) name them for another machine
    (`locojax.aot`: compile-only devices of a TPU slice)."""
    local = jax.local_devices() if local is None else list(local)
    train_axes = (MeshAxis.DATA, MeshAxis.FSDP)
    if trains:
        train = _mesh(jax.devices() if devices is None else list(devices),
                      plan.sharding.train.mesh, train_axes)
    else:
        train = _mesh(local, {MeshAxis.DATA: 1, MeshAxis.FSDP: len(local)}, train_axes)
    tensor = int(plan.sharding.rollout.mesh[MeshAxis.TENSOR])
    rollout = _mesh(local, {MeshAxis.REPLICA: len(local) // tensor, MeshAxis.TENSOR: tensor},
                    (MeshAxis.REPLICA, MeshAxis.TENSOR))
    return train, rollout


def build_host(plan: ExecutionPlan, host_index: int, *, trains: bool = True,
               devices: Sequence | None = None, local: Sequence | None = None,
               data: bool = True, turns: bool = True) -> Host:
    """All runtime objects of host `host_index` (a CO host, a single-controller worker).

    `trains=False` builds a host that only rolls out (a DA rollout actor): no training mesh
    over other processes, no train steps. `devices` / `local` as in `build_meshes`;
    `data=False` (a host built to compile its programs, `locojax.aot`) reads no problems and
    starts no scorer: `workload`, `stream` and `scorer` are None. `turns=False`: a host
    that never runs an episode's environment (a DA trainer, a single-controller worker,
    whose driver runs them) starts no environment workers.
    """
    role = HostRole(index=host_index, count=plan.topology.hosts)
    arch = assemble.model_arch(plan.model.config)
    train_mesh, rollout_mesh = build_meshes(plan, role, trains, devices, local)
    graphdef, abstract = split_params(nnx.eval_shape(lambda: Qwen3(arch, rngs=nnx.Rngs(0))))
    specs = {name: tuple(spec) for name, spec in plan.sharding.train.specs.items()}
    lora = assemble.lora_spec(plan.algorithm)
    model = ModelLayout(
        config=plan.model.config, arch=arch, graphdef=graphdef, train_mesh=train_mesh,
        rollout_mesh=rollout_mesh,
        param_shardings=param_shardings(train_mesh, abstract, specs) if trains else None,
        batch_sharding=batch_sharding(train_mesh), lora=lora,
        adapter_shardings=adapter_shardings(train_mesh, abstract_adapters(arch, lora))
        if lora is not None and trains else None)
    tokenizer = assemble.tokenizer_for(plan.model.config, arch.vocab)
    sampling = assemble.sampling_settings(plan.sampling, plan.batch.response_len, tokenizer)
    greedy = SamplingSettings(temperature=0.0, max_new_tokens=sampling.max_new_tokens,
                              stop_ids=sampling.stop_ids, pad_id=sampling.pad_id)
    grpo = assemble.grpo_settings(plan.algorithm, plan.batch.response_len, plan.run.steps,
                                  temperature=plan.sampling.temperature,
                                  micro_batches=plan.batch.micro_batches,
                                  keep_probs=plan.batch.keep_head_probs,
                                  fused_attention=plan.batch.fused_attention)
    return Host(
        plan=plan, role=role, model=model, tokenizer=tokenizer, sampling=sampling,
        greedy=greedy,
        engine=assemble.engine_options(plan.sampling, plan.batch.slots,
                                       plan.batch.prompt_store_rows),
        grpo=grpo,
        data=host_data(plan, tokenizer, sampling, turns) if data else None,
    )


def host_data(plan: ExecutionPlan, tokenizer: Tokenizer, sampling: SamplingSettings,
              turns: bool) -> HostData:
    """The host's problems (checked against the tokenizer's alphabet), its prompt stream, its
    reward scorer and, with `turns` and a multi-turn workload, its episodes' workers."""
    workload = load_workload(assemble.workload_settings(plan.workload), plan.run.seed)
    assemble.check_alphabet(workload, tokenizer, plan.workload.prompt_template)
    cores = host_cores(plan)
    return HostData(
        workload=workload,
        stream=PromptStream(len(workload.train), plan.batch.prompts_per_step,
                            DataPosition(plan.run.seed)),
        scorer=Scorer(assemble.reward_settings(plan.workload), workers=cores),
        turns=turn_setup(plan, tokenizer, sampling, cores) if turns else None)


def rollout_shardings(host: Host, params):
    """The plan's rollout layout of `params` on this process's rollout mesh
    (`plan.sharding.rollout.specs`: heads, kv heads, FFN and vocabulary over `tensor`, whole
    on every `replica`)."""
    specs = {name: tuple(spec) for name, spec in host.plan.sharding.rollout.specs.items()}
    return param_shardings(host.model.rollout_mesh, params, specs)


"""Everything one host needs to run the plan, built once at start-up from the plan alone.

`build_host(plan, host)` returns a typed `Host` (not a tuple): meshes, model definition and
initial parameters in the training layout, tokenizer, problems, scorer and jitted steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from compiler.config import ControllerKind
from compiler.plan import ExecutionPlan
from locojax.data import PromptStream, Workload, load_workload
from locojax.data.stream import DataPosition
from locojax.model import ModelArch, Qwen3, split_params
from locojax.rewards import Scorer
from locojax.rollout.sampler import SamplingSettings
from locojax.runtime import assemble
from locojax.runtime.hostwork import host_cores
from locojax.tokenizers import Tokenizer
from locojax.train import (
    GrpoSettings,
    batch_sharding,
    init_opt_state,
    make_logprob_fn,
    make_optimizer,
    make_sft_step,
    make_train_step,
    param_shardings,
)


@dataclass(frozen=True)
class HostRole:
    """Which emulated host this process is, and whether it drives all of them."""

    index: int
    """Host index in the plan (the JAX process index under the local controller)."""
    count: int
    """Hosts in the plan."""
    drives_all: bool
    """Single controller: this one process rolls out and scores for every host."""

    @property
    def is_primary(self) -> bool:
        """Writes metrics, checkpoints' metadata and the final export."""
        return self.index == 0


@dataclass(frozen=True)
class Host:
    """One host's runtime objects."""

    plan: ExecutionPlan
    role: HostRole
    arch: ModelArch
    graphdef: nnx.GraphDef
    train_mesh: Mesh
    rollout_mesh: Mesh
    param_shardings: Any
    batch_sharding: NamedSharding
    tokenizer: Tokenizer
    workload: Workload
    stream: PromptStream
    scorer: Scorer
    sampling: SamplingSettings
    greedy: SamplingSettings
    grpo: GrpoSettings
    train_step: Any
    sft_step: Any
    ref_logprobs: Any
    """logp(params, tokens, positions, valid) of the frozen reference; None when kl_coef is 0."""

    def prompt_range(self) -> tuple[int, int]:
        """[start, stop) of each step's prompts this process samples."""
        if self.role.drives_all:
            return 0, self.plan.batch.prompts_per_step
        r = self.plan.batch.prompt_ranges[self.role.index]
        return r.start, r.stop

    def init_params(self, seed: int):
        """Initial parameters (identical on every host) in the training layout."""
        _, params = split_params(Qwen3(self.arch, rngs=nnx.Rngs(seed)))
        return jax.device_put(params, self.param_shardings) if jax.process_count() == 1 else (
            _global_from_local(params, self.param_shardings))

    def init_opt_state(self, params, optimizer):
        """Fresh AdamW state for `params`, laid out like them."""
        tx = make_optimizer(optimizer)
        return init_opt_state(tx, params, self.param_shardings)


def _global_from_local(params, shardings):
    """Global arrays from a full host-local copy present on every process."""
    def build(x, sharding):
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    return jax.tree.map(build, params, shardings)


def _mesh(devices: list, shape: dict, names: tuple[str, ...]) -> Mesh:
    sizes = tuple(int(shape[n]) for n in names)
    if int(np.prod(sizes)) != len(devices):
        raise RuntimeError(f"plan wants mesh {dict(zip(names, sizes, strict=True))} but this "
                           f"process sees {len(devices)} devices")
    grid = np.array(devices, dtype=object).reshape(sizes)
    return Mesh(grid, names, axis_types=(AxisType.Auto,) * len(names))


def build_meshes(plan: ExecutionPlan, role: HostRole, trains: bool) -> tuple[Mesh, Mesh]:
    """Training mesh (data, fsdp) over every device of the training group, and this
    process's rollout mesh (replica, tensor); a process that never trains (a DA rollout
    actor) gets a local stand-in training mesh."""
    local = jax.local_devices()
    if trains:
        train = _mesh(jax.devices(), plan.sharding.train.mesh, ("data", "fsdp"))
    else:
        train = _mesh(local, {"data": 1, "fsdp": len(local)}, ("data", "fsdp"))
    rollout_devices = jax.devices() if role.drives_all else local
    tensor = int(plan.sharding.rollout.mesh["tensor"])
    rollout = _mesh(rollout_devices, {"replica": len(rollout_devices) // tensor, "tensor": tensor},
                    ("replica", "tensor"))
    return train, rollout


def build_host(plan: ExecutionPlan, host_index: int, *, trains: bool = True) -> Host:
    """All runtime objects of host `host_index` (0 under the single controller).

    `trains=False` builds a host that only rolls out (a DA rollout actor): no training mesh
    over other processes, no train steps.
    """
    drives_all = plan.controller.kind == ControllerKind.single
    role = HostRole(index=host_index, count=plan.topology.hosts, drives_all=drives_all)
    arch = assemble.model_arch(plan.model.config)
    train_mesh, rollout_mesh = build_meshes(plan, role, trains)
    graphdef, abstract = split_params(nnx.eval_shape(lambda: Qwen3(arch, rngs=nnx.Rngs(0))))
    specs = {name: tuple(spec) for name, spec in plan.sharding.train.specs.items()}
    shardings = param_shardings(train_mesh, abstract, specs) if trains else None
    batch = batch_sharding(train_mesh)
    tokenizer = assemble.tokenizer_for(plan.model.config, arch.vocab)
    workload = load_workload(assemble.workload_settings(plan.workload), plan.run.seed)
    stream = PromptStream(len(workload.train), plan.batch.prompts_per_step,
                          DataPosition(plan.run.seed))
    sampling = assemble.sampling_settings(plan.sampling, plan.batch.response_len, tokenizer)
    greedy = SamplingSettings(temperature=0.0, max_new_tokens=sampling.max_new_tokens,
                              stop_ids=sampling.stop_ids, pad_id=sampling.pad_id)
    grpo = assemble.grpo_settings(plan.algorithm, plan.batch.response_len, plan.run.steps)
    sft = assemble.sft_optimizer(plan.algorithm)
    return Host(
        plan=plan, role=role, arch=arch, graphdef=graphdef, train_mesh=train_mesh,
        rollout_mesh=rollout_mesh, param_shardings=shardings, batch_sharding=batch,
        tokenizer=tokenizer, workload=workload, stream=stream,
        scorer=Scorer(assemble.reward_settings(plan.workload), workers=host_cores(plan)),
        sampling=sampling, greedy=greedy,
        grpo=grpo,
        train_step=make_train_step(graphdef, grpo, param_shardings=shardings,
                                   batch_sharding=batch) if trains else None,
        sft_step=make_sft_step(graphdef, sft, param_shardings=shardings, batch_sharding=batch)
        if trains else None,
        ref_logprobs=make_logprob_fn(graphdef, param_shardings=shardings, batch_sharding=batch)
        if trains and plan.algorithm.kl_coef > 0 else None,
    )


def rollout_params(host: Host, params):
    """The training-layout parameters as a full copy on this process's rollout mesh.

    CO keeps a whole copy of the weights on every host (FSDP within the host), so the plan's
    transfer is an on-host reshard: the local shards are assembled into the rollout layout.
    """
    target = NamedSharding(host.rollout_mesh, P())
    if jax.process_count() == 1:
        return jax.device_put(params, target)

    def local_copy(x):
        buf = np.empty(x.shape, x.dtype)
        for shard in x.addressable_shards:
            buf[shard.index] = np.asarray(shard.data)
        return jax.device_put(buf, target)

    return jax.tree.map(local_copy, params)

"""Builds the `Host` of one DA actor: a rollout host (local devices only) or a trainer host.

CO's `build_host` puts every process on one global training mesh; in DA a rollout actor has
no part in training, and the training mesh spans the trainer actors' devices only.
"""

from __future__ import annotations

import jax
from flax import nnx

from compiler.plan import ExecutionPlan
from locojax import assemble
from locojax.data import DataPosition, PromptStream, load_workload
from locojax.model import Qwen3, split_params
from locojax.rewards import Scorer
from locojax.rollout.sampler import SamplingSettings
from locojax.runtime.components import Host, HostRole, _mesh
from locojax.train import (
    batch_sharding,
    make_logprob_fn,
    make_sft_step,
    make_train_step,
    param_shardings,
)


def build_role_host(plan: ExecutionPlan, host_index: int, trains: bool) -> Host:
    """Host `host_index` as a rollout actor (`trains=False`) or a trainer actor."""
    role = HostRole(index=host_index, count=plan.topology.hosts, drives_all=False)
    arch = assemble.model_arch(plan.model.config)
    local = jax.local_devices()
    tensor = int(plan.sharding.rollout.mesh["tensor"])
    rollout_mesh = _mesh(local, {"replica": len(local) // tensor, "tensor": tensor},
                         ("replica", "tensor"))
    if trains:
        train_mesh = _mesh(jax.devices(), plan.sharding.train.mesh, ("data", "fsdp"))
    else:  # never used for training; keeps the Host type whole
        train_mesh = _mesh(local, {"data": 1, "fsdp": len(local)}, ("data", "fsdp"))
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
    kl = trains and plan.algorithm.kl_coef > 0
    return Host(
        plan=plan, role=role, arch=arch, graphdef=graphdef, train_mesh=train_mesh,
        rollout_mesh=rollout_mesh, param_shardings=shardings, batch_sharding=batch,
        tokenizer=tokenizer, workload=workload, stream=stream,
        scorer=Scorer(assemble.reward_settings(plan.workload)), sampling=sampling, greedy=greedy,
        grpo=grpo,
        train_step=make_train_step(graphdef, grpo, param_shardings=shardings,
                                   batch_sharding=batch) if trains else None,
        sft_step=make_sft_step(graphdef, assemble.sft_optimizer(plan.algorithm),
                               param_shardings=shardings, batch_sharding=batch)
        if trains else None,
        ref_logprobs=make_logprob_fn(graphdef, param_shardings=shardings, batch_sharding=batch)
        if kl else None,
    )


def rollout_prompt_range(plan: ExecutionPlan, host_index: int) -> tuple[int, int]:
    """[start, stop) of each step's prompts rollout host `host_index` samples."""
    for r in plan.batch.prompt_ranges:
        if r.host == host_index:
            return r.start, r.stop
    raise ValueError(f"host {host_index} has no prompt range in the plan (not a rollout host)")


def trainer_row_range(plan: ExecutionPlan, rank: int, rows: int) -> tuple[int, int]:
    """[start, stop) of the step's rows trainer process `rank` feeds to the global batch."""
    n = len(plan.partitions.trainer_hosts)
    return rows * rank // n, rows * (rank + 1) // n

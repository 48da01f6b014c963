"""The plan's own programs compiled for a given set of devices (module docstring: `aot`).

    compile_programs(plan, devices)   -> ProgramReport per program (train_step, rollout_prefill,
                                         rollout_slots, reshard (CO), transfer (DA))
    lower_programs(plan, devices, p)  -> {program: lowered StableHLO text for platform p}

Every program is the runtime's own function on the runtime's own shardings: the host objects
come from `components.build_host`, the train step from `train_programs.make_steps` with
`train_programs.abstract_step_inputs`, the rollout programs from `rollout.engine`, the reshard from
`weights` (`_cast_to`, one program per parameter as the runtime runs it; with LoRA the
trainer's merge, `adapters._merge`, on the frozen base and the adapters). With LoRA the train
step takes the adapters, their moments, the batch and the frozen base, as the trainer calls it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from compiler.axes import MeshAxis
from compiler.config import TokenizerKind
from compiler.cost import flops as cost_flops
from compiler.cost import memory as cost_memory
from compiler.cost import prefill as cost_prefill
from compiler.cost.estimate import train_step_network_bytes
from compiler.params import param_table
from compiler.passes.lengths import multi_turn, reply_len
from compiler.plan import ExecutionPlan, PlacementMode
from locojax.aot.analysis import (
    Collective,
    ProgramOutOfMemory,
    bytes_accessed,
    collectives,
    flops,
    memory,
)
from locojax.aot.analysis import out_of_memory as _out_of_memory
from locojax.aot.hloflops import matmul_flops
from locojax.aot.slice import SliceHosts, slice_hosts
from locojax.model import abstract_model
from locojax.rollout import engine, episodes
from locojax.runtime import adapters as lora_weights
from locojax.runtime import weights
from locojax.runtime.adapters import abstract_adapters_on
from locojax.runtime.components import Host, build_host, rollout_shardings
from locojax.runtime.train_programs import abstract_step_inputs, make_steps
from locojax.runtime.trained import abstract_params, params_structs
from locojax.runtime.turns import episode_width, refilled, reply_settings, wave_rows
from locojax.train import param_shardings

__all__ = ["Collective", "ProgramOutOfMemory", "ProgramReport", "compile_programs",
           "lower_programs"]

PROGRAMS = ("train_step", "rollout_prefill", "rollout_slots", "reshard")
"""The programs `compile_programs` knows, in the order it compiles them."""
SCAN_NOTE = ("dot + convolution FLOPs of the optimised HLO, every while / scan body (layers, "
             "micro- and mini-batches, the slot loop) times the compiler's known trip count "
             "or its condition's bound (neither: once); cost_analysis() counts each body "
             "once (compiler_flops)")


@dataclass(frozen=True)
class ProgramReport:
    """One compiled program: the compiler's per-device figures beside the plan's."""

    name: str
    """train_step, rollout_prefill, rollout_slots, reshard or transfer."""
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    compiler_bytes: int
    """Peak per device as the compiler counts it (`Memory.peak_bytes`)."""
    plan_bytes: int
    """The plan's own per-device estimate for this program."""
    flops: float
    """The compiler's matmul FLOPs per device, loop bodies multiplied out (`flops_note`)."""
    plan_flops: float
    """The cost model's FLOPs per device for the whole program (every loop iteration)."""
    flops_note: str
    collectives: tuple[Collective, ...]
    plan_network_bytes: int
    """Bytes the cost model moves per device over the network for this program."""
    compile_s: float
    """Lowering + compile seconds."""
    devices: int = 0
    """Devices of the program's mesh."""
    compiler_flops: float = 0.0
    """`cost_analysis()`'s FLOPs per device: every loop body counted once."""
    peak_bytes: int = 0
    """The compiler's own peak (TPU: `peak_memory_in_bytes`); arguments + outputs - aliased
    + temporaries can exceed it (not everything is live at once)."""
    bytes_accessed: float = 0.0
    """`cost_analysis()`'s bytes read and written per device: every loop body once (the slot
    loop: one iteration, i.e. one refill + decode step, both branches of its conditional)."""

    @property
    def ratio(self) -> float:
        """plan_bytes / compiler_bytes."""
        return self.plan_bytes / max(self.compiler_bytes, 1)


@dataclass(frozen=True)
class _Hosts:
    """The plan's trainer host and one rollout host, built over the slice's devices."""

    trainer: Host
    rollout: Host
    slice: SliceHosts


def _without_checkpoint_vocabulary(plan: ExecutionPlan) -> ExecutionPlan:
    """`plan` built with the char tokenizer when it names a checkpoint's vocabulary and no
    checkpoint (a Llama preset planned on a laptop): the programs take token ids, and which
    vocabulary maps them changes no shape (the model's `vocab` does)."""
    model = plan.model.config
    if model.tokenizer != TokenizerKind.checkpoint or model.checkpoint is not None:
        return plan
    config = dataclasses.replace(model, tokenizer=TokenizerKind.char)
    return dataclasses.replace(plan, model=dataclasses.replace(plan.model, config=config))


def _build(plan: ExecutionPlan, devices: Sequence, host_devices: Sequence | None) -> _Hosts:
    """`host_devices`: where one rollout host's programs compile instead of its devices of
    the slice (a one-host slice of the same chips; `worker.host_slice_devices`)."""
    plan = _without_checkpoint_vocabulary(plan)
    hosts = slice_hosts(plan, devices)
    parts = plan.partitions
    t0, r0 = parts.trainer_hosts[0], parts.rollout_hosts[0]
    trainer = build_host(plan, t0, devices=hosts.of(parts.trainer_hosts),
                         local=hosts.devices[t0], data=False)
    if host_devices is not None:
        rollout = build_host(plan, r0, trains=False, local=list(host_devices), data=False)
    else:
        rollout = trainer if r0 == t0 else build_host(plan, r0, trains=False,
                                                      local=hosts.devices[r0], data=False)
    return _Hosts(trainer, rollout, hosts)


def _rollout_inputs(host: Host):
    """(graphdef, rollout params, (prompt_PxW, len_P)) as structs, as the episode passes them."""
    params = abstract_model(host.model.arch)[1]
    rollout = params_structs(params, host.model.compute_dtype, rollout_shardings(host, params))
    b = host.plan.batch
    prompts = (jax.ShapeDtypeStruct((b.prompts_per_rollout_host, b.max_prompt_len), jnp.int32),
               jax.ShapeDtypeStruct((b.prompts_per_rollout_host,), jnp.int32))
    return (host.model.graphdef, rollout), prompts


def _episode_programs(host: Host, platforms: tuple[str, ...] | None = None):
    """A multi-turn plan's rollout programs (`rollout.episodes`), lowered: turn 0's extend of
    every episode's opening into the episodes' caches, and one turn's decode loop (with
    `sampling.schedule=refill`, `advance`'s chunk of `sampling.decode_chunk` steps)."""
    (graphdef, params), _ = _rollout_inputs(host)
    plan = host.plan
    return episodes.lower_programs(
        graphdef, params, reply_settings(plan, host.sampling),
        rows=wave_rows(plan),
        width=episode_width(plan), opening=plan.batch.max_prompt_len, mesh=host.model.rollout_mesh,
        batch_axis=MeshAxis.REPLICA, platforms=platforms,
        chunk=plan.sampling.decode_chunk if refilled(plan) else 0)


def _engine_kwargs(host: Host, platform: str | None = None) -> dict:
    """`episode.generate_prompts`'s arguments to the engine; lowered for another `platform`
    than the mesh's (e.g. 'cuda' over CPU devices), the engine's choices on that platform:
    layers scanned over the stacked weights, no CPU kernels."""
    options = host.engine
    if platform not in (None, "cpu"):
        options = dataclasses.replace(options, stacked_layers=True, cpu_kernels="off")
    return dict(group_size=host.plan.batch.group_size, mesh=host.model.rollout_mesh,
                batch_axis="replica", options=options)


def _reshard_parts(host: Host):
    """(master param struct, compute dtype, rollout sharding) of each parameter: CO's on-host
    reshard (`weights.rollout_params`) from this host's training shards (FSDP within the host:
    its own devices, as `components.build_meshes` lays a host out)."""
    specs = {n: tuple(s) for n, s in host.plan.sharding.train.specs.items()}
    params = abstract_model(host.model.arch)[1]
    train_mesh = host.model.train_mesh
    if len({d.process_index for d in train_mesh.devices.flat}) > 1 or \
            train_mesh.devices.size != host.model.rollout_mesh.devices.size:
        local = build_host(host.plan, host.role.index, trains=False,
                           local=list(host.model.rollout_mesh.devices.flat), data=False)
        train_mesh = local.model.train_mesh
    masters = params_structs(params, host.model.param_dtype,
                             param_shardings(train_mesh, params, specs))
    dtype = jnp.dtype(host.model.compute_dtype)
    return [(x, dtype, s) for x, s in zip(jax.tree.leaves(masters), jax.tree.leaves(
        rollout_shardings(host, params)), strict=True)]


def _merge_inputs(host: Host) -> tuple:
    """LoRA's CO rollout copy as `Trainer.policy` makes it (`adapters.merged_params`): the
    frozen base (compute dtype, training shardings) and the adapters, merged in one program;
    the reshard then places the result (`weights.rollout_params`: a `device_put`, no
    program)."""
    model = host.model
    return (abstract_params(model, model.compute_dtype), abstract_adapters_on(model), model.lora,
            jnp.dtype(model.compute_dtype))


def _reshard_programs(host: Host, lower: Callable) -> list:
    """`lower(jitted, *args)` of each program of CO's reshard: one cast per parameter, or
    with LoRA the merge (`_merge_inputs`)."""
    if host.model.lora is not None:
        return [lower(lora_weights._merge, *_merge_inputs(host))]
    return [lower(weights._cast_to, x, dtype, target) for x, dtype, target in
            _reshard_parts(host) if x.dtype != dtype]


def reshard_is_a_program(plan: ExecutionPlan) -> bool:
    """Whether CO's reshard runs as compiled programs: with one training host the master
    shards are all this process's (`weights.rollout_params` casts them in one program per
    parameter); with several, the runtime copies this host's shards to host memory and places
    them (`device_put`), which no compiler sees."""
    return (plan.placement.mode == PlacementMode.colocated
            and len(plan.partitions.trainer_hosts) == 1)


def _lowered_train(hosts: _Hosts):
    steps = make_steps(hosts.trainer)
    return steps.train, abstract_step_inputs(hosts.trainer, steps)


def _guard(name: str, fn: Callable):
    """`fn()`, the compiler's out-of-memory error raised as `ProgramOutOfMemory`."""
    try:
        return fn()
    except Exception as err:  # XlaRuntimeError and friends: only an OOM is translated
        oom = _out_of_memory(name, err)
        if oom is None:
            raise
        raise oom from err


def _report(name: str, compiled: list, seconds: float, plan_bytes: float, plan_flops: float,
            network: float, devices: int) -> ProgramReport:
    """One report of one program (or of the per-parameter programs run one after another:
    arguments and outputs summed, the largest temporaries)."""
    mems = [memory(c) for c in compiled]
    args, out = sum(m.argument_bytes for m in mems), sum(m.output_bytes for m in mems)
    alias, temp = sum(m.alias_bytes for m in mems), max(m.temp_bytes for m in mems)
    peak = mems[0].peak_bytes if len(mems) == 1 else args + out - alias + temp
    colls: dict[str, list[int]] = {}
    for c in compiled:
        for coll in collectives(c.as_text()):
            got = colls.setdefault(coll.kind, [0, 0, 0])
            got[0], got[1] = got[0] + coll.count, got[1] + coll.bytes
            got[2] += coll.received_bytes
    note = SCAN_NOTE + ("; summed over the per-parameter programs" if len(compiled) > 1 else "")
    return ProgramReport(
        name=name, argument_bytes=args, output_bytes=out, alias_bytes=alias, temp_bytes=temp,
        compiler_bytes=peak, plan_bytes=int(plan_bytes),
        flops=float(sum(matmul_flops(c.as_text()) for c in compiled)),
        plan_flops=float(plan_flops), flops_note=note,
        collectives=tuple(Collective(k, *counts) for k, counts in colls.items()),
        plan_network_bytes=int(network), compile_s=seconds, devices=devices,
        compiler_flops=float(sum(flops(c) for c in compiled)), peak_bytes=peak,
        bytes_accessed=float(sum(bytes_accessed(c) for c in compiled)))


def _timed(name: str, fn: Callable):
    start = time.perf_counter()
    out = _guard(name, fn)
    return out, time.perf_counter() - start


def _plan_figures(plan: ExecutionPlan) -> dict[str, tuple[float, float, float]]:
    """program -> (bytes, FLOPs, network bytes) per device, by the plan and its cost model
    (`compiler.cost`: `memory`, `flops`, and the byte counts of `phases.collectives`).

    Bytes: the train step's `batch.train_step_bytes_per_device`; the slot loop's
    `batch.rollout_bytes_per_device` (the engine's peak); the prefill's
    `compiler.cost.prefill.plan_prefill_bytes`; the reshard's master shards,
    the rollout copy and one whole parameter gathered (the plan budgets none of its own for
    it)."""
    model, b, topo = plan.model.config, plan.batch, plan.topology
    train, tensor = plan.sharding.train.mesh, int(plan.sharding.rollout.mesh["tensor"])
    fsdp = int(train["fsdp"])
    network = train_step_network_bytes(plan)
    adapters = cost_memory.adapter_elements(model, plan.algorithm)
    train_flops = (cost_flops.train_flops(model, b.seq_len, adapters, head_len=b.response_len)
                   * b.sequences_per_step)
    turns = multi_turn(plan.workload)
    reply = reply_len(plan.workload, plan.sampling) if turns else b.response_len
    context = b.max_prompt_len + b.response_len / 2
    decode = cost_flops.decode_token_flops(model, context) * reply
    # Multi-turn: the programs run one wave of episodes, each opening prefilled (no prompt
    # shared by its group).
    per_replica = b.slots if turns else b.sequences_per_rollout_replica
    prompts = per_replica if turns else per_replica // b.group_size
    tp_bytes = 2 * (tensor - 1) / tensor * model.hidden * cost_memory.dtype_bytes(model)
    local_fsdp = min(fsdp, topo.devices_per_host)
    table = param_table(model)
    masters = sum(p.size for p in table) / local_fsdp * cost_memory.param_dtype_bytes(model)
    # The reshard gathers one whole parameter at a time in the compute dtype (the largest:
    # the embedding) before laying it out.
    gathered = max(p.size for p in table) * cost_memory.dtype_bytes(model)
    weights_bytes = plan.sharding.rollout.bytes_per_device
    reshard = masters + weights_bytes + gathered
    if plan.algorithm.lora.rank > 0:  # the trainer's merge (base + s A B) is the program
        reshard = cost_memory.lora_merge_bytes(model, plan.algorithm, table, local_fsdp)
    return {
        "train_step": (b.train_step_bytes_per_device, train_flops / plan.partitions
                       .trainer_devices, network),
        "rollout_prefill": (cost_prefill.plan_prefill_bytes(plan), cost_flops.prefill_flops(
            model, b.max_prompt_len) * prompts / tensor,
            tp_bytes * prompts * b.max_prompt_len * model.num_layers * 2),
        # The program holds one wave's caches; another wave's in flight sit beside it.
        "rollout_slots": (b.rollout_bytes_per_device - b.waiting_cache_bytes,
                          decode * per_replica / tensor,
                          tp_bytes * per_replica * reply * model.num_layers * 2),
        "reshard": (reshard, 0.0, 0.0),
    }


def compile_programs(plan: ExecutionPlan, devices: Sequence, *,
                     lower_only_platform: str | None = None,
                     programs: Collection[str] = PROGRAMS,
                     host_devices: Sequence | None = None) -> tuple[ProgramReport, ...]:
    """Compile the plan's programs for `devices` (every device of the slice, e.g.
    `topologies.get_topology_desc(...).devices`) and report each beside the plan.

    Raises `ProgramOutOfMemory` for the first program the compiler finds does not fit.
    `lower_only_platform` lowers for that platform instead (no compile; figures 0: a
    machine without that platform's compiler, e.g. 'cuda'). `programs`: those of
    `PROGRAMS` to compile (the rollout's two go together); the plan decides whether it has a
    reshard program (`reshard_is_a_program`). `host_devices`: a one-host slice's devices,
    where one host's programs compile on a slice of several hosts (`_build`)."""
    if lower_only_platform is not None:
        texts = lower_programs(plan, devices, lower_only_platform)
        return tuple(ProgramReport(name, 0, 0, 0, 0, 0, 0, 0.0, 0.0, "lowered only", (), 0, 0.0)
                     for name in texts)
    hosts = _build(plan, devices, host_devices)
    figures = _plan_figures(plan)

    def report(name, compiled, seconds, mesh):
        return _report(name, compiled, seconds, *figures[name], devices=mesh.devices.size)

    reports = []
    if "train_step" in programs:
        train, inputs = _lowered_train(hosts)
        step, seconds = _timed("train_step", lambda: train.lower(*inputs).compile())
        reports.append(report("train_step", [step], seconds, hosts.trainer.model.train_mesh))
    mesh = hosts.rollout.model.rollout_mesh
    if {"rollout_prefill", "rollout_slots"} & set(programs) and multi_turn(plan.workload):
        extend, decode = _episode_programs(hosts.rollout)
        prefill, seconds = _timed("rollout_prefill", lambda: extend.compile())
        reports.append(report("rollout_prefill", [prefill], seconds, mesh))
        slots, seconds = _timed("rollout_slots", lambda: decode.compile())
        reports.append(report("rollout_slots", [slots], seconds, mesh))
    elif {"rollout_prefill", "rollout_slots"} & set(programs):
        model, prompts = _rollout_inputs(hosts.rollout)
        timed: dict[str, float] = {}
        prefill, slots = _guard("rollout_prefill", lambda: engine.compile_programs(
            model, prompts, hosts.rollout.sampling, seconds=timed,
            **_engine_kwargs(hosts.rollout)))
        reports += [report("rollout_prefill", [prefill], timed["prefill"], mesh),
                    report("rollout_slots", [slots], timed["slots"], mesh)]
    if "reshard" in programs and reshard_is_a_program(plan):
        compiled, seconds = _timed("reshard", lambda: _reshard_programs(
            hosts.rollout, lambda fn, *args: fn.lower(*args).compile()))
        if compiled:
            reports.append(report("reshard", compiled, seconds, mesh))
    return tuple(reports)


def lower_programs(plan: ExecutionPlan, devices: Sequence, platform: str) -> dict[str, str]:
    """program -> its lowered StableHLO text for `platform` ('cpu', 'tpu', 'cuda'): the same
    programs as `compile_programs` (the reshard's per-parameter programs joined)."""
    hosts = _build(plan, devices, None)
    train, inputs = _lowered_train(hosts)
    platforms = (platform,)
    out = {"train_step": train.trace(*inputs).lower(lowering_platforms=platforms).as_text()}
    if multi_turn(plan.workload):
        prefill, slots = _episode_programs(hosts.rollout, platforms)
    else:
        model, prompts = _rollout_inputs(hosts.rollout)
        prefill, slots = engine.lower_programs(model, prompts, hosts.rollout.sampling,
                                               platforms=platforms,
                                               **_engine_kwargs(hosts.rollout, platform))
    out |= {"rollout_prefill": prefill.as_text(), "rollout_slots": slots.as_text()}
    if reshard_is_a_program(plan):
        out["reshard"] = "\n".join(_reshard_programs(
            hosts.rollout, lambda fn, *args: fn.trace(*args).lower(
                lowering_platforms=platforms).as_text()))
    return out

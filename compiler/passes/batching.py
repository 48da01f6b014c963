"""Pass 3: the batch plan. Who samples which prompts; how the train batch splits.

Rollout host i (in host order) samples prompts [i * n, (i + 1) * n) of each step, n =
prompts_per_step / rollout hosts, all G completions of each, so a group never crosses hosts
and every sample is produced exactly once. Training splits the step's sequences evenly over
the trainer devices, then into `algorithm.optimizer_steps_per_batch` mini-batches, then into
the fewest micro-batches whose activations (`memory.activation_bytes_per_row`) fit beside the
training state. The supervised warm-up trains on one row per prompt, so its prompts must
divide over the trainer devices too. (Held-out evaluation pads its batch to the rollout
replicas itself; it needs no rule here.)
"""

from __future__ import annotations

from math import ceil

from compiler.config import Config
from compiler.cost import memory
from compiler.errors import PlanError
from compiler.passes.sharding import REPLICA, TENSOR
from compiler.plan import BatchPlan, Partitions, PromptRange, Sharding, Topology


def _check_positive(cfg: Config) -> None:
    w = cfg.workload
    for key, value in (("workload.prompts_per_step", w.prompts_per_step),
                       ("workload.group_size", w.group_size),
                       ("workload.max_prompt_len", w.max_prompt_len),
                       ("workload.max_response_len", w.max_response_len),
                       ("algorithm.optimizer_steps_per_batch",
                        cfg.algorithm.optimizer_steps_per_batch)):
        if value < 1:
            raise PlanError(key, value, "must be at least 1", "positive")
    if cfg.sampling.max_new_tokens < 0:
        raise PlanError("sampling.max_new_tokens", cfg.sampling.max_new_tokens,
                        "must be >= 0 (0: workload.max_response_len)", "positive")


def _rollout(cfg: Config, parts: Partitions, sharding: Sharding) -> tuple[int, int]:
    """Prompts per rollout host and sequences per rollout replica."""
    w, hosts = cfg.workload, len(parts.rollout_hosts)
    if w.prompts_per_step % hosts:
        raise PlanError("workload.prompts_per_step", w.prompts_per_step,
                        f"not divisible by the {hosts} rollout hosts", "prompts_divide_hosts")
    per_host = w.prompts_per_step // hosts
    group_sequences = per_host * w.group_size * sharding.rollout_hosts_per_replica
    replicas = sharding.rollout.mesh[REPLICA]
    if group_sequences % replicas:
        raise PlanError("workload.prompts_per_step", w.prompts_per_step,
                        f"{per_host} prompts x {w.group_size} completions per host "
                        f"({group_sequences} per replica group) do not divide over {replicas} "
                        "rollout replicas", "sequences_divide_replicas")
    return per_host, group_sequences // replicas


def _waves(cfg: Config, topo: Topology, parts: Partitions, sharding: Sharding, seq_len: int,
           per_replica: int) -> tuple[float, int]:
    """KV bytes of one sequence per device and the passes a replica needs to decode its share."""
    tensor = sharding.rollout.mesh[TENSOR]
    # K/V heads follow the kv_heads rule: split over tensor when it divides them, else whole.
    kv_split = tensor if cfg.model.num_kv_heads % tensor == 0 else 1
    kv = memory.kv_bytes_per_sequence(cfg.model, seq_len, kv_split)
    budget = topo.device_memory_bytes * memory.ROLLOUT_FRACTION - sharding.rollout.bytes_per_device
    if parts.rollout_hosts == parts.trainer_hosts:
        budget -= sharding.train.bytes_per_device
    concurrent = int(budget // kv)
    if concurrent < 1:
        raise PlanError("workload.max_response_len", cfg.workload.max_response_len,
                        f"one {seq_len}-token sequence needs {kv:.4g} B of KV cache per device "
                        f"but only {max(budget, 0):.4g} B are left beside the rollout weights",
                        "rollout_memory")
    return kv, max(1, ceil(per_replica / concurrent))


def batch(cfg: Config, topo: Topology, parts: Partitions, sharding: Sharding) -> BatchPlan:
    """Prompt ranges per rollout host and the train batch split."""
    _check_positive(cfg)
    w = cfg.workload
    response_len = cfg.sampling.max_new_tokens or w.max_response_len
    seq_len = w.max_prompt_len + response_len
    if seq_len > cfg.model.max_position:
        raise PlanError("workload.max_response_len", w.max_response_len,
                        f"max_prompt_len {w.max_prompt_len} + response {response_len} = "
                        f"{seq_len} tokens exceeds model.max_position={cfg.model.max_position}",
                        "sequence_length")
    per_host, per_replica = _rollout(cfg, parts, sharding)
    kv, waves = _waves(cfg, topo, parts, sharding, seq_len, per_replica)
    sequences = w.prompts_per_step * w.group_size
    devices = parts.trainer_devices
    if sequences % devices:
        raise PlanError("workload.prompts_per_step", w.prompts_per_step,
                        f"{w.prompts_per_step} prompts x {w.group_size} = {sequences} sequences "
                        f"do not divide over {devices} trainer devices", "rows_divide_devices")
    if cfg.algorithm.sft_warmup_steps and w.prompts_per_step % devices:
        raise PlanError("workload.prompts_per_step", w.prompts_per_step,
                        f"the supervised warm-up (algorithm.sft_warmup_steps="
                        f"{cfg.algorithm.sft_warmup_steps}) trains on one row per prompt, and "
                        f"{w.prompts_per_step} rows do not divide over {devices} trainer devices",
                        "sft_rows_divide_devices")
    rows, steps = sequences // devices, cfg.algorithm.optimizer_steps_per_batch
    if rows % steps:
        raise PlanError("algorithm.optimizer_steps_per_batch", steps,
                        f"{rows} rows per trainer device do not divide into {steps} mini-batches",
                        "mini_batches_divide")
    act = memory.activation_bytes_per_row(cfg.model, seq_len)
    budget = topo.device_memory_bytes - sharding.train.bytes_per_device
    mini_rows = rows // steps
    micro = next((m for m in range(1, mini_rows + 1)
                  if mini_rows % m == 0 and mini_rows // m * act <= budget), None)
    if micro is None:
        raise PlanError("workload.max_response_len", w.max_response_len,
                        f"one {seq_len}-token sequence needs about {act:.4g} B of activations but "
                        f"only {budget:.4g} B per trainer device are left beside the state",
                        "activation_memory")
    ranges = tuple(PromptRange(h, i * per_host, (i + 1) * per_host)
                   for i, h in enumerate(parts.rollout_hosts))
    return BatchPlan(
        prompts_per_step=w.prompts_per_step, group_size=w.group_size,
        sequences_per_step=sequences, prompts_per_rollout_host=per_host, prompt_ranges=ranges,
        max_prompt_len=w.max_prompt_len, response_len=response_len, seq_len=seq_len,
        sequences_per_rollout_replica=per_replica, kv_bytes_per_sequence=kv,
        rollout_waves=waves, rows_per_trainer_device=rows, optimizer_steps=steps,
        micro_batches=micro, rows_per_micro_batch=mini_rows // micro,
        activation_bytes_per_row=act)

"""Pass 3: the batch plan. Who samples which prompts; how the train batch splits.

Rollout host i (in host order) samples prompts [i * n, (i + 1) * n) of each step, n =
prompts_per_step / rollout hosts, all G completions of each, so a group never crosses hosts
and every sample is produced exactly once. A rollout replica keeps `slots` of its sequences
resident at once (`memory.rollout_bytes`: its KV budget beside the weights and the prompt KV
store, or `sampling.slots`), refilled as rows finish. Training splits the step's sequences
evenly over the trainer devices, then into `algorithm.optimizer_steps_per_batch`
mini-batches, then into the fewest micro-batches whose train step
(`memory.train_step_memory`) fits a device beside what stays resident there, and keeps the
output head's softmax when that still fits. The supervised warm-up trains on one row per
prompt, so its prompts must divide over the trainer devices too; its one update per step
splits into micro-batches by the same rule (no reference is resident yet). (Held-out evaluation pads
its batch to the rollout replicas itself; it needs no rule here.)

Dynamic sampling (`algorithm.dynamic_sampling=filter`) keeps this batch plan: a rollout host
samples further batches of its n prompts (its range of a second stream, the same shape, so the
same compiled rollout) until n of its groups are informative or it has sampled
`algorithm.max_sample_batches`; its train rows are always n groups, the first n informative
ones in sampling order and, when the bound is hit, zero-std groups with their loss mask
cleared (zero-weight rows: no sequence to any loss aggregation). So the train step, its
micro-batches and the rows each host contributes are the planned ones in every mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, prod

from compiler.config import (
    AlgorithmConfig,
    MeshConfig,
    ModelConfig,
    SamplingConfig,
    WorkloadConfig,
)
from compiler.cost import memory
from compiler.cost.prefill import extend_memory
from compiler.errors import PlanError
from compiler.params import ParamInfo
from compiler.passes.lengths import Lengths, cache_len, multi_turn, reply_len
from compiler.passes.sharding import FSDP, REPLICA, TENSOR, device_key
from compiler.plan import BatchPlan, Partitions, PromptRange, Sharding, Topology
from compiler.vocab import DType, LoraWarmup, Remat, RolloutSchedule

EMBEDDING = "embed/embedding"
"""The embedding table's parameter name (`compiler.params`)."""


def _check_positive(w: WorkloadConfig, sampling: SamplingConfig,
                    algorithm: AlgorithmConfig) -> None:
    for key, value in (("workload.prompts_per_step", w.prompts_per_step),
                       ("workload.group_size", w.group_size),
                       ("workload.max_prompt_len", w.max_prompt_len),
                       ("workload.max_response_len", w.max_response_len),
                       ("algorithm.optimizer_steps_per_batch",
                        algorithm.optimizer_steps_per_batch)):
        if value < 1:
            raise PlanError(key, value, "must be at least 1", "positive")
    if sampling.slots < 0:
        raise PlanError("sampling.slots", sampling.slots,
                        "must be >= 0 (0: as many as the KV budget allows)", "positive")
    if sampling.max_new_tokens < 0:
        raise PlanError("sampling.max_new_tokens", sampling.max_new_tokens,
                        "must be >= 0 (0: workload.max_response_len)", "positive")


def _rollout(w: WorkloadConfig, parts: Partitions, sharding: Sharding) -> tuple[int, int]:
    """Prompts per rollout host and sequences per rollout replica."""
    hosts = len(parts.rollout_hosts)
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


@dataclass(frozen=True)
class _RolloutMemory:
    kv_per_sequence: float
    slots: int
    waves: int
    store_rows: int
    bytes_per_device: float
    in_flight: int = 1


def _rollout_memory(w: WorkloadConfig, sampling: SamplingConfig, model: ModelConfig,
                    lens: Lengths, topo: Topology, parts: Partitions, sharding: Sharding,
                    per_host: int, per_replica: int) -> _RolloutMemory:
    """The slots a replica's devices hold beside the weights and the prompt KV store."""
    tensor, replicas = sharding.rollout.mesh[TENSOR], sharding.rollout.mesh[REPLICA]
    # K/V heads follow the kv_heads rule: split over tensor when it divides them, else whole.
    kv_split = tensor if model.num_kv_heads % tensor == 0 else 1
    kv_bytes = None if sampling.kv_dtype is None else (
        2 if sampling.kv_dtype == DType.bfloat16 else 4)
    seq_len = lens.seq
    kv = memory.kv_bytes_per_sequence(model, seq_len, kv_split, kv_bytes, ring=True)
    prompts = per_host * sharding.rollout_hosts_per_replica
    sharded = prompts % replicas == 0
    whole = prompts // replicas if sharded else prompts
    prompt_kv = memory.kv_bytes_per_sequence(model, lens.prompt, kv_split, kv_bytes)
    embed = sharding.rollout.specs[EMBEDDING]
    split = prod(sharding.rollout.mesh[a] for a in embed if a is not None)
    weights = sharding.rollout.bytes_per_device + memory.embedding_relayout_bytes(
        model, topo.device_kind, split)
    budget = topo.device_memory_bytes * memory.ROLLOUT_FRACTION
    if parts.rollout_hosts == parts.trainer_hosts:
        budget -= sharding.train.bytes_per_device
    platform = topo.platform
    copies = memory.rollout_weight_copies(platform)
    # Slots scan stacked caches unless sliding layers keep rings (`rollout.layout`).
    stacked = memory.kv_columns(model, seq_len, ring=True) == memory.kv_columns(model, seq_len)
    kernel = memory.tpu_decode_kernel(platform, stacked, tensor, seq_len, model.head_dim)
    relaid = memory.relaid_layer_kv_bytes(model, kv, platform, stacked, kernel)
    per_slot = memory.rollout_bytes(0.0, platform, 0.0, 1, kv, model.vocab, relaid)
    if multi_turn(w):
        heads = model.num_heads / (tensor if model.num_heads % tensor == 0 else 1)
        return _episode_memory(w, sampling, model, weights, platform, budget, per_replica,
                               kv_split, kv_bytes, heads, topo.device_kind)

    def fit(store_rows: int) -> int:
        fixed = memory.rollout_bytes(weights, platform, store_rows * prompt_kv, 0, kv,
                                     model.vocab)
        return int((budget - fixed) // per_slot)

    store_rows = _store_rows(sampling.prompt_store, whole, sharded, per_replica, fit)
    store = store_rows * prompt_kv
    left = fit(store_rows)
    if left < 1:
        fixed = memory.rollout_bytes(weights, platform, store, 0, kv, model.vocab)
        raise PlanError("workload.max_response_len", w.max_response_len,
                        f"one {seq_len}-token sequence needs {per_slot:.4g} B per device (KV "
                        f"cache and sampling) but only {max(budget - fixed, 0):.4g} B are left "
                        f"beside the rollout weights (x{copies}) and the prompt KV store "
                        f"({store_rows} prompts)", "rollout_memory")
    slots = min(per_replica, left)
    if sampling.slots:
        if sampling.slots > left:
            raise PlanError("sampling.slots", sampling.slots,
                            f"at most {left} slots of {per_slot:.4g} B fit a rollout device "
                            f"beside a prompt KV store of {store_rows} prompts",
                            "rollout_memory")
        slots = min(per_replica, sampling.slots)
    return _RolloutMemory(kv, slots, ceil(per_replica / slots), store_rows,
                          memory.rollout_bytes(weights, platform, store, slots, kv, model.vocab,
                                               relaid))


def _episode_memory(w: WorkloadConfig, sampling: SamplingConfig, model: ModelConfig,
                    weights: float, platform: str, budget: float, per_replica: int,
                    kv_split: int, kv_bytes: int | None, heads: float,
                    device_kind: str) -> _RolloutMemory:
    """Multi-turn episodes (`locojax.rollout.episodes`): a wave of episodes keeps its KV
    caches from its first turn to its last, P + E + R columns each (prompt, episode, one
    reply written before its end is known), with no prompt store; a replica's episodes run
    in waves of `slots`, the largest divisor of them that fits (`sampling.slots` when set,
    which must divide them) both the decode loop (the caches and the sampler's values) and
    turn 0's extend (the caches and each opening's attention over its cache: `heads` query
    heads a device). `sampling.env_overlap`: two waves in flight, each at most half the
    replica's episodes, the other wave's caches resident beside the running one's program.
    On a TPU7x both programs keep a re-laid copy of the running wave's keys
    (`memory.episode_key_relayout_bytes`)."""
    columns = cache_len(w, sampling)
    kv = memory.kv_bytes_per_sequence(model, columns, kv_split, kv_bytes)
    relayout = memory.episode_key_relayout_bytes(kv, device_kind)
    extend = extend_memory(model, episodes=1, width=w.max_prompt_len, columns=columns,
                           cache_bytes=0.0, weights_bytes=0.0, query_heads=heads,
                           response_len=reply_len(w, sampling))
    flight = 2 if sampling.env_overlap else 1
    if sampling.env_overlap and sampling.schedule is RolloutSchedule.refill:
        raise PlanError("sampling.env_overlap", "true",
                        "two waves in flight are for sampling.schedule=static; with refill "
                        "each episode's turn already decodes while the others' environments "
                        "run", "rollout_memory")
    if per_replica < flight:
        raise PlanError("sampling.env_overlap", "true",
                        f"two waves at once need two episodes a rollout replica; it has "
                        f"{per_replica}", "rollout_memory")
    per_slot = max(memory.rollout_bytes(0.0, platform, 0.0, 1, kv, model.vocab),
                   kv + extend.attention + extend.uniforms) + relayout + (flight - 1) * kv
    left = budget - memory.rollout_bytes(weights, platform, 0.0, 0, kv, model.vocab)
    fit = int(left // per_slot)
    if fit < 1:
        raise PlanError("workload.max_episode_len", w.max_episode_len,
                        f"one episode of {columns} tokens (prompt, episode and a reply) needs "
                        f"{per_slot:.4g} B per device but only {max(left, 0):.4g} B are left "
                        f"beside the rollout weights "
                        f"(x{memory.rollout_weight_copies(platform)})", "rollout_memory")
    most = min(fit, per_replica // flight)
    slots = sampling.slots or max(k for k in range(1, most + 1) if per_replica % k == 0)
    if slots > most or per_replica % slots:
        raise PlanError("sampling.slots", sampling.slots,
                        f"a wave of episodes must divide the {per_replica} of a rollout "
                        f"replica and fit: at most {most} of {per_slot:.4g} B"
                        + (" (two waves at once)" if flight > 1 else ""), "rollout_memory")
    resident = memory.rollout_bytes(weights, platform, 0.0, slots, kv, model.vocab) + (
        slots * relayout)
    return _RolloutMemory(kv, slots, per_replica // slots, 0,
                          resident + (flight - 1) * slots * kv, flight)


def _store_rows(asked: int, whole: int, sharded: bool, per_replica: int, fit) -> int:
    """Prompts the store holds at once: the largest divisor of the replica's prompts that
    leaves at least half the slots a one-prompt store would (capped at the replica's rows), so
    every prompt when that fits; `sampling.prompt_store` when set. A smaller store is refilled
    by a prefill of its next prompts inside the slot loop once its rows have all entered
    slots. A store shared by the replicas (prompts that do not split over them) stays whole."""
    if asked:
        if not sharded or whole % asked:
            raise PlanError("sampling.prompt_store", asked,
                            f"must divide the {whole} prompts of a rollout replica"
                            + ("" if sharded else " (and they must split over the replicas)"),
                            "prompt_store_divides")
        return asked
    if not sharded:
        return whole
    want = min(per_replica, -(-fit(1) // 2))
    return next((k for k in range(whole, 0, -1) if whole % k == 0 and fit(k) >= want), 1)


@dataclass(frozen=True)
class _Split:
    micro_batches: int
    keep_head_probs: bool
    step: memory.TrainStepMemory
    resident: float


def _train_split(w: WorkloadConfig, algorithm: AlgorithmConfig, model: ModelConfig,
                 mesh: MeshConfig, table: tuple[ParamInfo, ...], lens: Lengths, topo: Topology,
                 sharding: Sharding, rows: int, mini_rows: int, *, sft: bool = False) -> _Split:
    """The fewest micro-batches whose step fits beside what stays resident, whether the head
    then keeps its softmax, the step's bytes. `sft`: the supervised warm-up's step (no
    reference yet, no behaviour or reference log-probs among its inputs)."""
    train, seq_len = sharding.train, lens.seq
    params = memory.sharded_elements(table, train.specs, train.mesh)
    reference = algorithm.kl_coef > 0 and not sft
    # A whole-model LoRA warm-up (algorithm.lora.warmup=full) is full fine-tuning's step.
    whole = sft and algorithm.lora.warmup == LoraWarmup.full
    adapters = 0.0 if whole else memory.adapter_elements(model, algorithm)
    # Resident beside the step: the reference (compute dtype), made after the warm-up. CO's
    # rollout copy is not: the trainer drops it before the update and makes the next one
    # from the new weights. With LoRA the reference is the frozen base, a step argument.
    resident = params * memory.dtype_bytes(model) if reference and not adapters else 0.0
    budget = topo.device_memory_bytes * memory.TRAIN_STEP_FRACTION - resident
    fused = memory.fused_attention(model, topo.hardware.platform, seq_len, topo.devices)

    def step(micro: int, keep: bool) -> memory.TrainStepMemory:
        return memory.train_step_memory(
            model, params_per_device=params, fsdp=train.mesh[FSDP], batch_rows=rows,
            micro_rows=mini_rows // micro, micro_batches=micro, seq_len=seq_len,
            response_len=lens.response, remat=algorithm.remat == Remat.block,
            keep_probs=keep, fused_attention=fused,
            reference=reference, behaviour=not sft, rollout=algorithm.rollout_logp and not sft,
            platform=topo.hardware.platform, device_kind=topo.device_kind, table=table,
            adapters=adapters)

    micro = next((m for m in range(1, mini_rows + 1)
                  if mini_rows % m == 0 and step(m, False).total <= budget), None)
    if micro is None:
        one = step(mini_rows, False)
        fixed = one.total - one.activations
        key, value = ("workload.max_response_len", w.max_response_len)
        if fixed > budget:  # the state alone does not fit: more devices shard it thinner
            key, value = device_key(mesh, topo, sharding.fsdp_hosts)
        what = "the supervised warm-up's step" if sft else "the train step"
        raise PlanError(key, value,
                        f"{what} needs about {one.total:.4g} B per trainer device even "
                        f"with one {seq_len}-token row per micro-batch ({one.activations:.4g} B "
                        f"of activations, {fixed:.4g} B of state, gradients and weight copies) "
                        f"beside {resident:.4g} B resident, over the "
                        f"{topo.device_memory_bytes * memory.TRAIN_STEP_FRACTION:.4g} B "
                        f"({memory.TRAIN_STEP_FRACTION:.0%}) of a {topo.device_memory_bytes:.4g}"
                        " B device: shorten workload.max_response_len or max_prompt_len, or "
                        "add devices (mesh.chips)", "activation_memory")
    keep = step(micro, True).total <= budget
    return _Split(micro, keep, step(micro, keep), resident)


def batch(w: WorkloadConfig, sampling: SamplingConfig, algorithm: AlgorithmConfig,
          model: ModelConfig, mesh: MeshConfig, table: tuple[ParamInfo, ...], lens: Lengths,
          topo: Topology, parts: Partitions, sharding: Sharding) -> BatchPlan:
    """Prompt ranges per rollout host and the train batch split."""
    _check_positive(w, sampling, algorithm)
    response_len, seq_len = lens.response, lens.seq
    if seq_len > model.max_position:
        raise PlanError("workload.max_response_len", w.max_response_len,
                        f"max_prompt_len {w.max_prompt_len} + response {response_len} = "
                        f"{seq_len} tokens exceeds model.max_position={model.max_position}",
                        "sequence_length")
    per_host, per_replica = _rollout(w, parts, sharding)
    mem = _rollout_memory(w, sampling, model, lens, topo, parts, sharding, per_host, per_replica)
    sequences = w.prompts_per_step * w.group_size
    devices = parts.trainer_devices
    if sequences % devices:
        raise PlanError("workload.prompts_per_step", w.prompts_per_step,
                        f"{w.prompts_per_step} prompts x {w.group_size} = {sequences} sequences "
                        f"do not divide over {devices} trainer devices", "rows_divide_devices")
    if algorithm.sft_warmup_steps and w.prompts_per_step % devices:
        raise PlanError("workload.prompts_per_step", w.prompts_per_step,
                        f"the supervised warm-up (algorithm.sft_warmup_steps="
                        f"{algorithm.sft_warmup_steps}) trains on one row per prompt, and "
                        f"{w.prompts_per_step} rows do not divide over {devices} trainer devices",
                        "sft_rows_divide_devices")
    rows, steps = sequences // devices, algorithm.optimizer_steps_per_batch
    if rows % steps:
        raise PlanError("algorithm.optimizer_steps_per_batch", steps,
                        f"{rows} rows per trainer device do not divide into {steps} mini-batches",
                        "mini_batches_divide")
    split = _train_split(w, algorithm, model, mesh, table, lens, topo, sharding, rows,
                         rows // steps)
    micro, step_mem = split.micro_batches, split.step
    # The warm-up: one update per step on one row per prompt, split by the same rule.
    sft_rows = w.prompts_per_step // devices if algorithm.sft_warmup_steps else 0
    sft = _train_split(w, algorithm, model, mesh, table, lens, topo, sharding, sft_rows,
                       sft_rows, sft=True) if sft_rows else None
    ranges = tuple(PromptRange(h, i * per_host, (i + 1) * per_host)
                   for i, h in enumerate(parts.rollout_hosts))
    return BatchPlan(
        prompts_per_step=w.prompts_per_step, group_size=w.group_size,
        sequences_per_step=sequences, prompts_per_rollout_host=per_host, prompt_ranges=ranges,
        max_prompt_len=w.max_prompt_len, response_len=response_len, seq_len=seq_len,
        sequences_per_rollout_replica=per_replica, kv_bytes_per_sequence=mem.kv_per_sequence,
        slots=mem.slots, rollout_waves=mem.waves, prompt_store_rows=mem.store_rows,
        rollout_bytes_per_device=mem.bytes_per_device, rows_per_trainer_device=rows,
        optimizer_steps=steps,
        micro_batches=micro, rows_per_micro_batch=rows // steps // micro,
        activation_bytes_per_row=step_mem.activations / (rows // steps // micro),
        keep_head_probs=split.keep_head_probs, train_step_bytes_per_device=step_mem.total,
        fused_attention=memory.fused_attention(model, topo.hardware.platform, seq_len,
                                               topo.devices),
        train_resident_bytes_per_device=split.resident,
        sft_rows_per_trainer_device=sft_rows,
        sft_micro_batches=sft.micro_batches if sft else 0,
        sft_keep_head_probs=sft.keep_head_probs if sft else False,
        sft_step_bytes_per_device=sft.step.total if sft else 0.0, waves_in_flight=mem.in_flight)

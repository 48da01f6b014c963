"""Seconds of each phase of one RL step on one mode's view of the machine (see `compiler.cost.estimate`).

Every function here takes the config, the per-device `Machine` and a `ModeView` (which hosts
roll out and train, how the training state is sharded) and returns seconds; each formula is
stated in the `compiler.cost.estimate` module docstring. `Infeasible` says a mode cannot run on the
layout (not enough memory or hosts); the cost model records it instead of a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, floor

from compiler.config import AlgorithmConfig, ModelConfig
from compiler.cost import flops, memory
from compiler.cost.inputs import CostInputs
from compiler.hardware import torus_shape
from compiler.params import param_count
from compiler.passes.lengths import cache_len, lengths, multi_turn, reply_len
from compiler.vocab import Remat, RewardKind, RolloutSchedule

TOKEN_ID_BYTES = 4
"""Bytes of one token id on the wire (int32)."""


class Infeasible(Exception):
    """A mode cannot run on this layout; the message says why."""


@dataclass(frozen=True)
class Machine:
    """Per-device numbers of the layout's machine."""

    hosts: int
    devices_per_host: int
    devices_per_chip: float
    chips_per_host: float
    device_peak: float
    """Peak FLOP/s of one device in the model dtype."""
    device_hbm: float
    device_hbm_bw: float
    torus: bool
    """All chips are on one ICI slice (TPU), so cross-host collectives use ICI."""


@dataclass(frozen=True)
class ModeView:
    """How one mode uses the machine."""

    single: bool
    """One controller drives every host."""
    colocated: bool
    """Rollout and training share the same devices."""
    rollout_hosts: int
    trainer_hosts: int
    fsdp: int
    """Devices sharding one copy of the training state."""
    data: int
    """Copies of the training state."""
    tp: int
    """Devices of one rollout replica."""
    staleness: int
    rounds: tuple[float, ...]
    """Largest message of each weight-transfer round (DA)."""
    link: str
    """Link of the weight transfer (DA): ici, dcn or none."""
    waves: int = 0
    """Rollout waves from the plan (0: estimate them)."""
    micro: int = 0
    """Micro-batches per optimizer step from the plan (0: estimate them)."""


def scoring_forwards(algorithm: AlgorithmConfig) -> int:
    """Forwards without backward per batch before its updates: pi_old (only when the trainer
    recomputes it for several updates: `AlgorithmConfig.old_forward`) and the reference."""
    return int(algorithm.old_forward) + int(algorithm.kl_coef > 0)


def _lengths(cfg: CostInputs) -> tuple[int, int, int]:
    """Samples per step, prompt tokens, a train row's tokens after the prompt (one reply, or a
    multi-turn episode's `max_episode_len`: `passes.lengths`)."""
    w = cfg.workload
    return w.prompts_per_step * w.group_size, w.max_prompt_len, lengths(w, cfg.sampling).response


def turns(cfg: CostInputs) -> int:
    """The model's turns an episode is charged: `max_turns` with an environment or tools (every
    episode runs them all: the model's upper bound), else 1."""
    return cfg.workload.max_turns if multi_turn(cfg.workload) else 1


def _state_per_device(cfg: CostInputs, v: ModeView) -> float:
    return memory.training_state_bytes(cfg.model, cfg.algorithm) / v.fsdp


def rollout(cfg: CostInputs, m: Machine, v: ModeView) -> tuple[float, float, int]:
    """Compute and tensor-parallel seconds of the busiest rollout replica, and its waves."""
    model, c = cfg.model, cfg.hardware.cost
    n, lp, lr = _lengths(cfg)
    # Multi-turn: `turns` replies of R tokens each, every episode's cache P + E + R columns
    # (the environment's messages' prefill between turns is not counted).
    decoded = turns(cfg) * reply_len(cfg.workload, cfg.sampling)
    columns = cache_len(cfg.workload, cfg.sampling) if multi_turn(cfg.workload) else lp + lr
    devices = v.rollout_hosts * m.devices_per_host
    if v.tp > devices:
        raise Infeasible(f"rollout tensor parallel {v.tp} > {devices} rollout devices")
    batch = ceil(n / (devices // v.tp))
    # K/V heads split over tensor only when it divides them (the sharding pass's rule).
    kv_split = v.tp if model.num_kv_heads % v.tp == 0 else 1
    # A single-turn slot keeps a sliding layer's window only (`memory.kv_columns`).
    ring = not multi_turn(cfg.workload)
    weights = flops.param_bytes(model) / v.tp
    room = m.device_hbm * memory.ROLLOUT_FRACTION - weights
    room -= _state_per_device(cfg, v) if v.colocated else 0.0
    waves = v.waves
    if not waves:
        kv = memory.kv_bytes_per_sequence(model, columns, kv_split, ring=ring)
        per_wave = floor(room / kv) if room > 0 else 0
        if per_wave < 1:
            raise Infeasible(f"no room for one sequence's KV cache ({room / 2**30:.1f} GiB free)")
        waves = ceil(batch / per_wave)
    b = ceil(batch / waves)
    bw = m.device_hbm_bw * c.decode_efficiency
    rate = m.device_peak * c.prefill_efficiency * v.tp
    over = model.num_layers * c.decode_layer_s  # one pass through the layers
    prefill = max(b * flops.prefill_flops(model, lp) / rate, weights / bw) + over
    ctx = lp + (lr + 1) / 2
    read = memory.kv_bytes_per_sequence(model, ctx, kv_split, ring=ring)
    step = max((weights + b * read) / bw,
               b * flops.decode_token_flops(model, ctx) / rate) + over
    comm = _tensor_parallel(cfg, m, v, b * lp) + decoded * _tensor_parallel(cfg, m, v, b)
    return waves * (prefill + decoded * step), waves * comm, waves


def _tensor_parallel(cfg: CostInputs, m: Machine, v: ModeView, tokens: int) -> float:
    """Two all-reduces of the activations per layer (attention and MLP outputs) in a replica."""
    if v.tp == 1:
        return 0.0
    model = cfg.model
    moved = 2 * (v.tp - 1) / v.tp * tokens * model.hidden * memory.dtype_bytes(model)
    link = _group_link(m, v.tp)
    hop = 2 * ring_steps(m, v.tp, link) * cfg.hardware.cost.collective_latency_s
    per_reduce = moved / _device_link(cfg, m, link) + hop
    return 2 * model.num_layers * per_reduce


def train(cfg: CostInputs, m: Machine, v: ModeView) -> tuple[float, int]:
    """Log-prob forward + train forward/backward seconds, and the micro-batches they need."""
    model, c = cfg.model, cfg.hardware.cost
    n, lp, lr = _lengths(cfg)
    devices = v.trainer_hosts * m.devices_per_host
    scoring = scoring_forwards(cfg.algorithm)
    passes = 3 + scoring
    adapters = memory.adapter_elements(model, cfg.algorithm)
    work = (flops.train_flops(model, lp + lr, adapters, head_len=lr)
            + scoring * flops.forward_flops(model, lp + lr, head_len=lr))
    seconds = n * work / (devices * m.device_peak * c.train_efficiency)
    opt = max(cfg.algorithm.optimizer_steps_per_batch, 1)
    if v.micro:
        micro = opt * v.micro
    else:
        row = memory.activation_bytes_per_row(
            model, lp + lr, lr, remat=cfg.algorithm.remat == Remat.block,
            fused_attention=memory.fused_attention(model, cfg.hardware.platform, lp + lr,
                                                   devices),
            platform=cfg.hardware.platform)
        room = m.device_hbm - _state_per_device(cfg, v)
        if room < row:
            raise Infeasible(
                f"no room for one sequence's activations ({room / 2**30:.1f} GiB free)")
        micro = opt * ceil(ceil(ceil(n / devices) / opt) * row / room)
    # Fixed per-layer cost of every pass over every micro-batch (a backward counts as two).
    return seconds + micro * passes * model.num_layers * c.train_layer_s, micro


def _device_link(cfg: CostInputs, m: Machine, link: str) -> float:
    """Achieved bytes/s of one device on `link`."""
    hw = cfg.hardware
    per_chip = hw.dcn_bytes_per_s if link == "dcn" else hw.ici_bytes_per_s
    return per_chip / m.devices_per_chip * hw.cost.network_efficiency


def _host_link(cfg: CostInputs, m: Machine, link: str) -> float:
    """Achieved bytes/s of one host-to-host message on `link`."""
    hw = cfg.hardware
    per_chip = hw.dcn_bytes_per_s if link == "dcn" else hw.ici_bytes_per_s
    return per_chip * m.chips_per_host * hw.cost.network_efficiency


def _group_link(m: Machine, devices: int) -> str:
    """ICI inside a host or a TPU slice, DCN otherwise."""
    return "ici" if devices <= m.devices_per_host or m.torus else "dcn"


def ring_steps(m: Machine, devices: int, link: str) -> int:
    """Sequential steps of one all-gather or reduce-scatter among `devices` devices.

    A ring takes devices - 1 steps. Over ICI on a TPU torus the collective runs one ring per
    torus dimension of the group's chips (the compiler's slice shapes), plus one per extra
    device of a chip: sum(dim - 1) + devices_per_chip - 1 steps.
    """
    per_chip = max(round(m.devices_per_chip), 1)
    if devices <= 1:
        return 0
    if link == "ici" and m.torus and devices % per_chip == 0:
        chips = devices // per_chip
        shape = (chips,) if chips < 4 else torus_shape(chips)
        if shape is not None:
            return sum(d - 1 for d in shape) + per_chip - 1
    return devices - 1


def fsdp_passes(algorithm: AlgorithmConfig, micro: int) -> int:
    """Collectives over the FSDP-sharded weights per step: per micro-batch a gather for the
    forward, one for the backward, one per scoring forward, and a scatter of the gradient;
    LoRA's frozen base has no gradient, so no scatter (its gathers stay)."""
    scatter = 0 if algorithm.lora.rank > 0 else 1
    return micro * (2 + scatter + scoring_forwards(algorithm))


def adapter_gradient_bytes(cfg: CostInputs) -> float:
    """LoRA: bytes of the adapters' gradient, whole on every trainer device, in
    `model.param_dtype` (0 at rank 0)."""
    return memory.adapter_elements(cfg.model, cfg.algorithm) * memory.param_dtype_bytes(cfg.model)


def gradient_bytes(cfg: CostInputs) -> float:
    """Bytes of one whole gradient of the model: in `model.param_dtype`, the dtype the TPU
    compiler reduces it in (the suite's v5e step reduce-scatters the output weight's
    gradient in fp32 under bf16 compute: docs/aot.md)."""
    return float(param_count(cfg.model) * memory.param_dtype_bytes(cfg.model))


def block_bytes(model: ModelConfig) -> float:
    """Bytes of the decoder blocks' weights (compute dtype): all but the embedding and an
    untied output head."""
    outside = model.vocab * model.hidden * (1 if model.tie_embeddings else 2)
    return flops.param_bytes(model) - outside * memory.dtype_bytes(model)


def remat_gathers(algorithm: AlgorithmConfig, micro: int) -> int:
    """Gathers of the blocks' weights that `algorithm.remat=block` adds per step: the
    backward recomputes each block's forward and gathers its weights again (the TPU
    compiler's rematted computations: docs/aot.md); the embedding and head are outside."""
    return micro if algorithm.remat == Remat.block else 0


def table_gradient_bytes(model: ModelConfig) -> float:
    """Bytes of the gradient of one V x D table (the output head's or the lookup's), in
    `model.param_dtype`: what the TPU compiler reduces them in."""
    return float(model.vocab * model.hidden * memory.param_dtype_bytes(model))


def scatter_bytes(cfg: CostInputs, fsdp: int, data: int) -> float:
    """Bytes a trainer device receives reducing one micro-batch's gradient over its FSDP
    group of `fsdp`. One host's group (`data` 1) reduce-scatters the whole gradient:
    (f - 1) / f of `gradient_bytes`. On a slice of several hosts (`data` > 1) the TPU
    compiler all-reduces it within the group instead, the blocks' in the compute dtype and
    the output head's in fp32: 2 (f - 1) / f of `block_bytes` + `table_gradient_bytes`
    (docs/aot.md, "Network bytes against the compiler's collectives")."""
    if data <= 1:
        return gradient_bytes(cfg) * (fsdp - 1) / fsdp
    whole = block_bytes(cfg.model) + table_gradient_bytes(cfg.model)
    return 2 * (fsdp - 1) / fsdp * whole


def fsdp_bytes(cfg: CostInputs, fsdp: int, micro: int, data: int = 1) -> float:
    """Bytes a trainer device receives per step over its FSDP group of `fsdp`, `micro`
    micro-batches in all: (f - 1) / f of the weights (compute dtype) for every gather
    (`fsdp_passes` less the scatter) and of the blocks' weights for every `remat_gathers`,
    and `scatter_bytes` for every scatter (`data`: the data replicas the group is one of)."""
    if fsdp <= 1:
        return 0.0
    scatters = 0 if cfg.algorithm.lora.rank > 0 else micro
    gathers = fsdp_passes(cfg.algorithm, micro) - scatters
    whole = (gathers * flops.param_bytes(cfg.model)
             + remat_gathers(cfg.algorithm, micro) * block_bytes(cfg.model))
    return whole * (fsdp - 1) / fsdp + scatters * scatter_bytes(cfg, fsdp, data)


def data_parallel_bytes(cfg: CostInputs, fsdp: int, data: int, micro: int) -> float:
    """Bytes a trainer device receives per step reducing the gradient over the `data`
    replicas (none with LoRA: `_adapter_all_reduce`). The TPU compiler does it every
    micro-batch: the blocks' gradient shard (compute dtype) all-reduced over the replicas,
    2 (d - 1) / d x `block_bytes` / f, and the lookup table's fp32 gradient whole over all
    n = f d devices, 2 (n - 1) / n x `table_gradient_bytes` (docs/aot.md)."""
    if data <= 1 or cfg.algorithm.lora.rank > 0:
        return 0.0
    n = fsdp * data
    per_micro = (2 * (data - 1) / data * block_bytes(cfg.model) / fsdp
                 + 2 * (n - 1) / n * table_gradient_bytes(cfg.model))
    return micro * per_micro


def collectives(cfg: CostInputs, m: Machine, v: ModeView, micro: int) -> float:
    """FSDP gathers/scatters per micro-batch and the gradient all-reduce."""
    model, lat = cfg.model, cfg.hardware.cost.collective_latency_s
    layers = model.num_layers
    total = 0.0
    if v.fsdp > 1:
        passes = fsdp_passes(cfg.algorithm, micro) + remat_gathers(cfg.algorithm, micro)
        link = _group_link(m, v.fsdp)
        steps = ring_steps(m, v.fsdp, link)
        total += (fsdp_bytes(cfg, v.fsdp, micro, v.data) / _device_link(cfg, m, link)
                  + passes * layers * steps * lat)
    if cfg.algorithm.lora.rank > 0:
        return total + _adapter_all_reduce(cfg, m, v, micro)
    if v.data > 1:
        link = _group_link(m, v.fsdp * v.data)
        steps = 2 * ring_steps(m, v.data, link)
        total += (data_parallel_bytes(cfg, v.fsdp, v.data, micro) / _device_link(cfg, m, link)
                  + micro * layers * steps * lat)
    return total


def adapter_all_reduce_bytes(cfg: CostInputs, devices: int, micro: int) -> float:
    """LoRA: bytes a trainer device receives per step for the adapters' gradient, all-reduced
    over all `devices` each micro-batch, 2 (n - 1) / n x adapter gradient bytes (0 at rank 0
    or on one device)."""
    if devices <= 1:
        return 0.0
    return micro * 2 * (devices - 1) / devices * adapter_gradient_bytes(cfg)


def _adapter_all_reduce(cfg: CostInputs, m: Machine, v: ModeView, micro: int) -> float:
    """LoRA: the adapters are replicated on every trainer device, so each micro-batch's
    adapter gradient is all-reduced over all of them (`accumulate_grads` constrains it to the
    adapters' sharding inside its scan), `adapter_all_reduce_bytes`."""
    n = v.fsdp * v.data
    if n <= 1:
        return 0.0
    moved = adapter_all_reduce_bytes(cfg, n, micro)
    link = _group_link(m, n)
    steps = 2 * ring_steps(m, n, link)
    lat = cfg.hardware.cost.collective_latency_s
    return moved / _device_link(cfg, m, link) + micro * cfg.model.num_layers * steps * lat


def transfer(cfg: CostInputs, m: Machine, v: ModeView) -> float:
    """New weights into the rollout layout: a local reshard (CO) or transfer rounds (DA)."""
    lat = cfg.hardware.cost.collective_latency_s
    if v.colocated:
        if v.fsdp == 1:
            return 0.0
        moved = flops.param_bytes(cfg.model) / v.tp * (v.fsdp - 1) / v.fsdp
        link = _group_link(m, v.fsdp)
        steps = ring_steps(m, v.fsdp, link)
        return moved / _device_link(cfg, m, link) + cfg.model.num_layers * steps * lat
    bw = _host_link(cfg, m, "dcn" if v.link == "dcn" else "ici")
    return sum(b / bw + lat for b in v.rounds)


def estimated_rounds(cfg: CostInputs, m: Machine, v: ModeView) -> tuple[float, ...]:
    """DA rounds when the layout has none: each rollout host receives every trainer slice."""
    slices = ceil(v.fsdp / m.devices_per_host)
    count = max(slices, ceil(v.rollout_hosts * slices / v.trainer_hosts))
    return (transfer_bytes(cfg) / slices,) * count


def transfer_bytes(cfg: CostInputs) -> float:
    """Bytes DA sends each rollout host per update, in the compute dtype: the whole model, or
    with LoRA the adapters only (as the transfer pass cuts `params.adapter_table`)."""
    if cfg.algorithm.lora.rank > 0:
        return memory.adapter_elements(cfg.model, cfg.algorithm) * memory.dtype_bytes(cfg.model)
    return flops.param_bytes(cfg.model)


@dataclass(frozen=True)
class HostWorkCost:
    """Predicted seconds of one step's host work on the busiest host-work process."""

    detok: float
    score: float
    batch: float
    gather: float
    """Completions to the controller and train rows back (the single controller only)."""
    env: float = 0.0
    """Environment and tool steps: `env_step_s` for each episode's every turn, over the
    process's cores (multi-turn only)."""


def _core_share(cfg: CostInputs, m: Machine, processes: int) -> float:
    """Cores one of `processes` concurrent host-work processes has: its host's, or a share of
    the one machine's when the hosts are emulated on it (chips_per_host 0)."""
    cores = float(max(cfg.hardware.host_cores, 1))
    return cores / processes if cfg.hardware.chips_per_host == 0 else cores


SCORE_COST_KEY = {
    RewardKind.gsm8k: "score_gsm8k_s_per_sample",
    RewardKind.boxed: "score_boxed_s_per_sample",
    # the user's functions: unknown until measured; a number match's cost stands in
    RewardKind.python: "score_gsm8k_s_per_sample",
}
"""The host cost constant (`hardware.cost`) of scoring one completion, per reward kind."""


def score_s_per_sample(cfg: CostInputs) -> float:
    """Scoring seconds of one completion for the workload's reward kind."""
    return getattr(cfg.hardware.cost, SCORE_COST_KEY[RewardKind(cfg.workload.reward)])


def host_work(cfg: CostInputs, m: Machine, samples: int, processes: int,
              through_controller: bool) -> HostWorkCost:
    """Detokenise and score `samples` completions over the process's cores, encode their prompts
    and build their rows in one process, and (through a controller) move completions in and
    rows out.

    `processes` is how many host-work processes run at once (the hosts of CO or DA's rollout
    hosts; 1 for the single controller, whose workers wait meanwhile).
    """
    c = cfg.hardware.cost
    _, lp, lr = _lengths(cfg)
    share = _core_share(cfg, m, processes)
    per_core = max(samples / share, min(samples, 1))  # a sample is never split over cores
    prompts = samples / max(cfg.workload.group_size, 1)  # each prompt is encoded once
    batch = (prompts * lp * c.encode_s_per_token
             + samples * (lp + lr) * c.batch_s_per_token) / min(share, 1.0)
    gather = controller_traffic(cfg, m, samples) if through_controller else 0.0
    env = per_core * turns(cfg) * cfg.workload.env_step_s if multi_turn(cfg.workload) else 0.0
    return HostWorkCost(detok=per_core * lr * c.detok_s_per_token,
                        score=per_core * score_s_per_sample(cfg), batch=batch, gather=gather,
                        env=env)


def exposed_env(cfg: CostInputs, env_s: float, rollout_s: float) -> float:
    """The environment seconds of a step the devices wait for (`env_s`: the host's, its
    workers at once). `sampling.schedule=static`: all of them with one wave of episodes at a
    time; with two in flight (`sampling.env_overlap`, a turn's two waves alternating between
    decode and environment steps) those the decoding does not cover, and half a turn's (the
    last wave's last steps, with nothing left to decode beside them). `refill` (per-episode
    turns, each episode's answer taken as it comes): decode and environments as two stages
    of a pipeline, the step waiting for the environment seconds the decoding does not
    cover and one turn's share of the rest (the first turn's replies have nothing to wait
    beside, the last turn's environment steps nothing to decode beside)."""
    if not multi_turn(cfg.workload):
        return env_s
    if cfg.sampling.schedule is RolloutSchedule.refill:
        return max(env_s - rollout_s, 0.0) + min(env_s, rollout_s) / turns(cfg)
    if not cfg.sampling.env_overlap:
        return env_s
    return max(env_s - rollout_s, 0.0) + min(env_s, rollout_s) / (2 * turns(cfg))


def controller_bytes(cfg: CostInputs, samples: int) -> float:
    """Bytes through a single controller per step: the completions gathered (token ids, int32;
    mask, bool; log-probs, float32) and the train rows sent back (ids, positions, int32; valid,
    loss mask, bool; behaviour log-probs, float32), besides the prompt ids sent out."""
    _, lp, lr = _lengths(cfg)
    length = lp + lr
    gathered = TOKEN_ID_BYTES * length + 5 * lr
    scattered = (2 * TOKEN_ID_BYTES + 2 + 4) * length
    prompts = TOKEN_ID_BYTES * lp / max(cfg.workload.group_size, 1)
    return samples * (gathered + scattered + prompts)


def controller_traffic(cfg: CostInputs, m: Machine, samples: int) -> float:
    """Seconds the controller's link takes for `controller_bytes` of the other hosts' rows."""
    if m.hosts <= 1:
        return 0.0
    moved = controller_bytes(cfg, samples) * (m.hosts - 1) / m.hosts
    latency = 2 * (m.hosts - 1) * cfg.hardware.cost.collective_latency_s
    return moved / _host_link(cfg, m, "dcn") + latency


def dispatch_rounds(cfg: CostInputs, hosts_driven: int) -> int:
    """Rounds of dispatch_s one launch takes to reach `hosts_driven` hosts (see
    `CostConstants.dispatch_tree_arity`): h one after another, or 1 + ceil(log_k h) in a tree."""
    k = cfg.hardware.cost.dispatch_tree_arity
    if k < 2 or hosts_driven <= 1:
        return hosts_driven
    rounds, reached = 1, 1
    while reached < hosts_driven:  # integer ceil(log_k h), free of float rounding
        reached *= k
        rounds += 1
    return rounds


def dispatch(cfg: CostInputs, hosts_driven: int, remote: bool) -> float:
    """Program launches one controller issues per step: a single controller's reach the hosts
    it drives in `dispatch_rounds` of dispatch_s; a local controller's start on its own host
    (local_dispatch_s each, in parallel with the other hosts). Each turn after an episode's
    first is one launch more (the single controller's round trip to every worker); with
    `sampling.schedule=refill` each turn is ceil(R / `sampling.decode_chunk`) launches (a
    reply's decode in chunks; the slots' chunks run together)."""
    c = cfg.hardware.cost
    launches = c.dispatches_per_step + turns(cfg) - 1
    if multi_turn(cfg.workload) and cfg.sampling.schedule is RolloutSchedule.refill:
        chunks = ceil(reply_len(cfg.workload, cfg.sampling) / cfg.sampling.decode_chunk)
        launches = c.dispatches_per_step - 1 + turns(cfg) * chunks
    if not remote:
        return launches * c.local_dispatch_s
    return launches * c.dispatch_s * dispatch_rounds(cfg, hosts_driven)

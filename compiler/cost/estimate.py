"""Cost model: predicted seconds of one RL step for CO, DA and the single-controller baseline.

`estimate(inputs, layout)` evaluates all three modes on the machine of every plan, whatever
placement the plan chose. Constants come from `inputs.hardware` and `inputs.hardware.cost`
(`CostConstants`), echoed in `CostEstimate.assumptions`; FLOP and byte counts from
`compiler.cost.flops`, memory budgets from `compiler.cost.memory` (the compiler's own). Per
device, peak FLOP/s (of the model dtype), HBM bytes and bandwidth and link bandwidth are the
chip's divided by the devices per chip. N = prompts x group samples, Lp prompt and Lr
response tokens, L = Lp + Lr (static shapes: the engine always runs the full lengths), P the
weights' bytes, f the FSDP group, d the data replicas, tp the rollout tensor parallel.

- **rollout** (replicas of tp devices in parallel; the busiest sets the time): batch B =
  ceil(N / replicas). Its KV cache (K/V heads split over tp only when tp divides them) gets
  ROLLOUT_FRACTION of a device less P / tp (and the training state / f when colocated); if
  B sequences do not fit it decodes in waves of b = ceil(B / waves) (the plan's waves when
  the layout gives them). Per wave: prefill = max(b FLOPs_pre(Lp) / (tp peak
  prefill_efficiency), P / tp / bw) (FLOPs_pre: the output projection on the last prompt
  token only, the engine samples from it alone), then Lr steps of max((P / tp + b ctx KV
  bytes per token per device) / bw, b token FLOPs(ctx) / (tp peak prefill_efficiency));
  bw = HBM bytes/s x decode_efficiency, ctx = Lp + (Lr + 1) / 2 the mean context (exact
  for the bytes, a lower bound for the max). Each prefill and decode step also pays
  decode_layer_s per layer (fixed kernel overheads; 0 on accelerators).
- **train**: N x (3 forward/backward + 1 pi_old forward when `algorithm.old_forward` (+ 1
  reference when kl_coef > 0)) x FLOPs(L) over trainer devices x peak x train_efficiency
  (6 x params x tokens for the train pass), plus train_layer_s per layer, pass and
  micro-batch (fixed kernel overheads; 0 on accelerators). Micro-batches (the plan's, else
  estimated): enough that a device's rows of activations fit beside its training state,
  times `optimizer_steps_per_batch`.
- **network** (per device; link bytes/s x network_efficiency, ICI inside a host or on a TPU
  torus (we assume one slice holds the whole TPU machine), DCN otherwise):
  FSDP: per micro-batch and pass (gather for forward, for backward, scatter of gradients,
  gather for the log-prob (and reference) forward) P (f - 1) / f bytes; data parallel: per
  optimizer step a ring all-reduce of the gradient shard, 2 (d - 1) / d x P / f bytes;
  rollout tensor parallel: 2 all-reduces per layer per decode step of b D activations (b Lp
  D in prefill). LoRA (`algorithm.lora.rank` > 0): the frozen base (model dtype) has no
  gradient, so FSDP gathers it per micro-batch and pass but scatters nothing; the adapters,
  replicated on all n = f x d trainer devices, have their `model.param_dtype` gradient
  all-reduced over all of them each micro-batch, 2 (n - 1) / n x adapter bytes (the step
  constrains the accumulated gradient to their sharding inside its scan); no data-parallel
  all-reduce of the model. Each collective runs per layer and pays collective_latency_s per ring step:
  n - 1 for a gather or scatter over n devices, twice that for an all-reduce; over ICI on a
  torus, one ring per torus dimension, sum(dim - 1) + devices_per_chip - 1 steps.
- **host** (host CPUs, measured on CPUs: `python -m locojax.calibrate` fits the per-sample
  constants from runs' host_* metrics):
  dispatch: `dispatches_per_step` launches per step. A single controller's launch reaches
  the hosts in rounds of dispatch_s: h rounds one after another, or 1 + ceil(log_k h)
  through a k-ary tree of hosts (`dispatch_tree_arity` k; v7x/v5p assume k = 2); the
  calibrated dispatch_s is an effective per-program, per-host cost. A local controller (CO
  host, DA actor) launches on its own host, local_dispatch_s each, in parallel with the
  other hosts (no network round trip). Decode is one on-device loop in both (no per-token
  dispatch).
  detokenise + score: the busiest host-work process's samples (all N at the single
  controller, whose workers wait; ceil(N / rollout hosts) on a local one), spread over the
  cores it has (`hardware.host_cores`; emulated hosts, chips_per_host 0, share the one
  machine's cores): max(samples / cores, 1) x (Lr x detok_s_per_token + the reward kind's
  score_*_s_per_sample). batch, in one process: (samples / G) x Lp x encode_s_per_token
  (each prompt tokenised once) + samples x L x batch_s_per_token (group advantages, train
  rows). gather (single controller only): completions in
  (int32 ids, bool mask, float32 log-probs) and train rows out (ids, positions, masks,
  behaviour log-probs) plus prompt ids, the other hosts' share over the controller host's
  DCN, + 2 (h - 1) collective_latency_s.
- **transfer**: colocated, each device gathers its rollout copy from the FSDP shards, P / tp
  x (f - 1) / f bytes (zero when f = 1). DA: sum over rounds of (largest message / (link
  bytes/s per chip x chips per host x network_efficiency) + collective_latency_s); a CO
  layout has no DA rounds, so DA then assumes max(g, ceil(r g / t)) rounds of P / g over
  DCN (g hosts per FSDP group, r rollout and t trainer hosts); with LoRA P is the adapters'
  bytes in the model dtype (what the transfer pass sends).
- **dynamic sampling** (`algorithm.dynamic_sampling=filter`): rollout, its tensor parallel
  and the host work of N samples are charged E times, E the expected batches of the busiest
  rollout host from `algorithm.zero_std_share` (`compiler.cost.dynamic`; 1 when off). The
  train step keeps its planned rows, so training is not.
- **step**: CO and single run the phases one after another: rollout + host + train +
  network + transfer. DA with max_staleness >= 1 overlaps the rollout side
  (rollout + its tensor parallel + host work + dispatch) with the trainer side (train + its
  collectives + dispatch): step = max(sides) + transfer. The transfer is never hidden: the
  rollout hosts stop to load the new weights. With max_staleness = 0 both sides and the
  transfer add up (each side dispatches). compute/host/network_s are what lies on the
  critical path (step = compute + host + network + exposed transfer) and the shares are
  their fractions; transfer_share is 1 minus the other three, so the four sum to exactly 1.

DA on a CO layout splits hosts by `placement.rollout_fraction` (0.5 if it is 1.0 or leaves a
role without a host) with `max_staleness` (1 for a colocated placement, whose staleness is
not a DA setting) and the layout's FSDP group size on the trainers. A mode that cannot run
(DA on one host, memory) is `feasible=False` with a note and zero times.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from math import ceil

from compiler.axes import MeshAxis
from compiler.config import CostConstants, PlacementMode
from compiler.cost import dynamic, flops, memory
from compiler.cost import phases as ph
from compiler.cost.inputs import CostInputs, PlanCostInputs
from compiler.params import param_count
from compiler.plan import (
    Assumption,
    CostEstimate,
    ExecutionPlan,
    ModeCost,
    Partitions,
    Sharding,
    Topology,
    TransferPlan,
)
from compiler.vocab import DType, Remat

DA_FALLBACK_FRACTION = 0.5
"""Rollout fraction DA uses when the configured one is 1.0 or leaves a role empty."""
DA_FALLBACK_STALENESS = 1
"""Staleness DA uses when the placement is colocated (conf/placement/disaggregated.yaml)."""


@dataclass(frozen=True)
class CostLayout:
    """What the compiler decided, in numbers."""

    hosts: int
    devices_per_host: int
    chips: int
    rollout_hosts: int
    trainer_hosts: int
    fsdp_devices: int
    """Devices sharding one copy of the training state."""
    data_replicas: int
    """Copies of the training state (data parallel)."""
    rollout_tensor_parallel: int
    transfer_round_bytes: tuple[float, ...]
    """Bytes of the largest message in each transfer round."""
    transfer_link: str
    """`ici`, `dcn` or `none`."""
    rollout_waves: int = 0
    """Waves of the plan's own placement (`BatchPlan.rollout_waves`; 0: the model estimates)."""
    micro_batches: int = 0
    """Micro-batches per optimizer step of the plan's own placement (0: estimated)."""


def cost_layout(topo: Topology, parts: Partitions, sharding: Sharding,
                transfer: TransferPlan) -> CostLayout:
    """The numbers of a layout the compiler decided (or a plan holds) that the estimate reads."""
    return CostLayout(
        hosts=topo.hosts, devices_per_host=topo.devices_per_host, chips=topo.chips,
        rollout_hosts=len(parts.rollout_hosts), trainer_hosts=len(parts.trainer_hosts),
        fsdp_devices=sharding.train.mesh[MeshAxis.FSDP], data_replicas=sharding.data_replicas,
        rollout_tensor_parallel=sharding.rollout.mesh[MeshAxis.TENSOR],
        transfer_round_bytes=tuple(float(b) for b in transfer.round_bytes),
        transfer_link=transfer.link)


def _infeasible(note: str) -> ModeCost:
    zeros = {f.name: 0 if f.type == "int" else 0.0
             for f in fields(ModeCost) if f.name not in ("feasible", "note")}
    return ModeCost(feasible=False, note=note, **zeros)


def _mode_cost(parts: dict[str, float], work: ph.HostWorkCost, waves: int,
               micro: int) -> ModeCost:
    step = parts["compute"] + parts["host"] + parts["network"] + parts["exposed"]
    shares = [parts[k] / step for k in ("compute", "host", "network")] if step > 0 else [1, 0, 0]
    return ModeCost(
        feasible=True, note="", step_s=step, compute_s=parts["compute"],
        host_s=parts["host"], network_s=parts["network"], transfer_s=parts["transfer"],
        exposed_transfer_s=parts["exposed"], rollout_s=parts["rollout"],
        reward_s=work.detok + work.score, dispatch_s=parts["dispatch"], train_s=parts["train"],
        detok_s=work.detok, score_s=work.score, batch_s=work.batch, gather_s=work.gather,
        env_s=work.env,
        rollout_waves=waves, micro_batches=micro, compute_share=shares[0],
        host_share=shares[1], network_share=shares[2],
        transfer_share=1.0 - (shares[0] + shares[1] + shares[2]))


def _evaluate(cfg: CostInputs, m: ph.Machine, v: ph.ModeView) -> ModeCost:
    """Phase times of one mode combined into its step."""
    try:
        rollout, tensor, waves = ph.rollout(cfg, m, v)
        train, micro = ph.train(cfg, m, v)
    except ph.Infeasible as e:
        return _infeasible(str(e))
    network = ph.collectives(cfg, m, v, micro)
    transfer = ph.transfer(cfg, m, v)
    # Dynamic sampling: the busiest rollout host's expected batches (1 when off).
    batches = dynamic.sample_batches(cfg, v.rollout_hosts)
    rollout, tensor = rollout * batches, tensor * batches
    n = ceil(cfg.workload.prompts_per_step * cfg.workload.group_size * batches)
    scorers = 1 if v.single else v.rollout_hosts
    work = ph.host_work(cfg, m, ceil(n / scorers), scorers, through_controller=v.single)
    # The rollout side's host work: what its hosts do between sampling and training.
    rollout_host = (work.detok + work.score + work.batch + work.gather
                    + ph.exposed_env(cfg, work.env, rollout))
    dispatch = ph.dispatch(cfg, m.hosts, remote=True) if v.single else ph.dispatch(cfg, 1, False)
    parts = {"rollout": rollout, "train": train, "transfer": transfer, "exposed": transfer}
    if v.colocated:
        parts |= {"compute": rollout + train, "host": rollout_host + dispatch,
                  "network": tensor + network, "dispatch": dispatch}
    elif v.staleness == 0:
        parts |= {"compute": rollout + train, "host": rollout_host + 2 * dispatch,
                  "network": tensor + network, "dispatch": 2 * dispatch}
    elif rollout + tensor + rollout_host >= train + network:
        parts |= {"compute": rollout, "host": rollout_host + dispatch, "network": tensor,
                  "dispatch": dispatch}
    else:
        parts |= {"compute": train, "host": dispatch, "network": network, "dispatch": dispatch}
    return _mode_cost(parts, work, waves, micro)


def _machine(cfg: CostInputs, layout: CostLayout) -> ph.Machine:
    hw = cfg.hardware
    devices = layout.hosts * layout.devices_per_host
    per_chip = devices / layout.chips
    return ph.Machine(
        hosts=layout.hosts, devices_per_host=layout.devices_per_host,
        devices_per_chip=per_chip, chips_per_host=layout.chips / layout.hosts,
        device_peak=flops.peak_flops(hw, cfg.model) / per_chip,
        device_hbm=hw.hbm_bytes / per_chip, device_hbm_bw=hw.hbm_bytes_per_s / per_chip,
        torus=hw.slice_topology == "torus3d")


def _train_group(fsdp: int, devices: int) -> tuple[int, int] | None:
    """(fsdp, data) keeping the layout's FSDP group size on `devices` trainer devices."""
    if devices % fsdp == 0:
        return fsdp, devices // fsdp
    return (devices, 1) if devices >= fsdp else None


def _da_split(cfg: CostInputs, hosts: int) -> int:
    frac = cfg.placement.rollout_fraction
    r = int(frac * hosts + 0.5)
    if frac >= 1.0 or not 1 <= r < hosts:
        r = int(DA_FALLBACK_FRACTION * hosts + 0.5)
    return r


def _views(cfg: CostInputs, layout: CostLayout, m: ph.Machine) -> dict[str, ph.ModeView | str]:
    """The CO, DA and single views of the layout (a string says why DA cannot run)."""
    h, per = layout.hosts, layout.devices_per_host
    is_da = layout.rollout_hosts < h and layout.rollout_hosts + layout.trainer_hosts == h
    staleness = (DA_FALLBACK_STALENESS if cfg.placement.mode == PlacementMode.colocated
                 else cfg.placement.max_staleness)
    co_group = _train_group(layout.fsdp_devices, h * per) or (h * per, 1)
    co = ph.ModeView(single=False, colocated=True, rollout_hosts=h, trainer_hosts=h,
                     fsdp=co_group[0], data=co_group[1], tp=layout.rollout_tensor_parallel,
                     staleness=0, rounds=(), link="none")
    own = {"waves": layout.rollout_waves, "micro": layout.micro_batches}
    if is_da:
        views: dict[str, ph.ModeView | str] = {"co": co, "single": replace(co, single=True)}
        views["da"] = replace(co, colocated=False, rollout_hosts=layout.rollout_hosts,
                              trainer_hosts=layout.trainer_hosts, fsdp=layout.fsdp_devices,
                              data=layout.data_replicas, staleness=staleness,
                              rounds=tuple(layout.transfer_round_bytes),
                              link=layout.transfer_link, **own)
        return views
    co = replace(co, **own)
    views = {"co": co, "single": replace(co, single=True)}
    r = _da_split(cfg, h)
    group = _train_group(layout.fsdp_devices, (h - r) * per) if 1 <= r < h else None
    if group is None:
        views["da"] = (f"DA needs >= 2 hosts and trainers that hold the state "
                       f"({h} hosts, {r} rollout)")
        return views
    da = replace(co, colocated=False, rollout_hosts=r, trainer_hosts=h - r, fsdp=group[0],
                 data=group[1], staleness=staleness, link="dcn", waves=0, micro=0)
    views["da"] = replace(da, rounds=ph.estimated_rounds(cfg, m, da))
    return views


def _assumptions(cfg: CostInputs, m: ph.Machine) -> tuple[Assumption, ...]:
    hw, c, model = cfg.hardware, cfg.hardware.cost, cfg.model
    out = [Assumption(f.name, float(getattr(c, f.name)), c.source)
           for f in fields(c) if f.name != "source"]
    out += [Assumption(name, float(getattr(hw, name)), hw.source) for name in (
        "peak_flops_bf16" if model.dtype == DType.bfloat16 else "peak_flops_fp32",
        "hbm_bytes", "hbm_bytes_per_s", "ici_bytes_per_s", "dcn_bytes_per_s")]
    response = cfg.sampling.max_new_tokens or cfg.workload.max_response_len
    seq = cfg.workload.max_prompt_len + response
    derived, budgets = "compiler.cost.flops from the model entry", "compiler.cost.memory"
    out += [
        Assumption("param_count", float(param_count(model)), model.source),
        Assumption("param_bytes", flops.param_bytes(model), derived),
        Assumption("kv_bytes_per_token", flops.kv_bytes_per_token(model), derived),
        Assumption("state_bytes_per_param",
                   float(memory.train_state_bytes_per_param(model, cfg.algorithm)), budgets),
        Assumption("activation_bytes_per_row", memory.activation_bytes_per_row(
            model, seq, response, remat=cfg.algorithm.remat == Remat.block,
            fused_attention=memory.fused_attention(model, hw.platform, seq,
                                                   m.hosts * m.devices_per_host),
            platform=hw.platform),
            budgets),
        Assumption("rollout_fraction_of_device", memory.ROLLOUT_FRACTION, budgets),
        Assumption("zero_std_share", cfg.algorithm.zero_std_share,
                   "algorithm.zero_std_share (a run's measured frac_zero_std; charged with "
                   "algorithm.dynamic_sampling=filter)")]
    return tuple(out)


def estimate(cfg: CostInputs, layout: CostLayout) -> CostEstimate:
    """Predicted step time of CO, DA and the single controller on `layout`'s machine."""
    m = _machine(cfg, layout)
    views = _views(cfg, layout, m)
    costs = {k: _infeasible(v) if isinstance(v, str) else _evaluate(cfg, m, v)
             for k, v in views.items()}
    da = views["da"]
    return CostEstimate(
        co=costs["co"], da=costs["da"], single=costs["single"],
        da_rollout_hosts=0 if isinstance(da, str) else da.rollout_hosts,
        da_max_staleness=0 if isinstance(da, str) else da.staleness,
        assumptions=_assumptions(cfg, m))


def train_step_network_bytes(plan: ExecutionPlan) -> float:
    """Bytes one trainer device receives over the network in the plan's train step (every
    update's micro-batches): its FSDP gathers and gradient reductions, the data replicas'
    all-reduce and LoRA's adapter all-reduce (`phases.fsdp_bytes` and the rest), what
    `locojax-plan aot=true` holds against the TPU compiler's collectives."""
    cfg, mesh = PlanCostInputs.of(plan), plan.sharding.train.mesh
    fsdp, data = int(mesh["fsdp"]), int(mesh["data"])
    micro = plan.batch.micro_batches * max(plan.algorithm.optimizer_steps_per_batch, 1)
    return (ph.fsdp_bytes(cfg, fsdp, micro, data) + ph.data_parallel_bytes(cfg, fsdp, data, micro)
            + ph.adapter_all_reduce_bytes(cfg, fsdp * data, micro))


def estimate_plan(plan: ExecutionPlan, cost: CostConstants | None = None) -> CostEstimate:
    """A compiled plan's estimate again, under `cost` (default: its hardware entry's constants)."""
    return estimate(PlanCostInputs.of(plan, cost),
                    cost_layout(plan.topology, plan.partitions, plan.sharding, plan.transfer))

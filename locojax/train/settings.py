"""Typed runtime settings of the trainer (built by the coordination layer from the plan).

A field that mirrors a schema field takes its default from the schema section's default
(`compiler.sections`), so each default is written once; the runtime-only fields have their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from compiler.sections import AlgorithmConfig, SamplingConfig, WorkloadConfig
from compiler.vocab import (
    DUAL_CLIP_LOSSES,
    LossAggregation,
    LrSchedule,
    PolicyLoss,
    RatioLevel,
    Remat,
    RolloutCorrection,
)

if TYPE_CHECKING:
    from jax.sharding import Sharding

_ALGORITHM, _SAMPLING, _WORKLOAD = AlgorithmConfig(), SamplingConfig(), WorkloadConfig()


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW, schedule and gradient clipping of one training phase (RL or SFT)."""

    learning_rate: float = _ALGORITHM.learning_rate
    """Peak learning rate."""
    schedule: LrSchedule = _ALGORITHM.lr_schedule
    """Shape after warm-up."""
    warmup_steps: int = _ALGORITHM.warmup_steps
    """Optimizer updates of linear warm-up from 0 to the peak."""
    total_steps: int = 1
    """Optimizer updates of the whole phase (cosine horizon, warm-up included)."""
    min_lr_ratio: float = _ALGORITHM.min_lr_ratio
    """Cosine floor as a fraction of the peak."""
    weight_decay: float = _ALGORITHM.weight_decay
    """Decoupled weight decay (not applied to norm scales)."""
    b1: float = _ALGORITHM.adam_b1
    """First-moment decay."""
    b2: float = _ALGORITHM.adam_b2
    """Second-moment decay."""
    eps: float = 1e-8
    """Adam denominator epsilon."""
    grad_clip: float = _ALGORITHM.grad_clip
    """Global gradient-norm clip (0: off)."""


@dataclass(frozen=True)
class ForwardSettings:
    """The trainer's forward pass and token scoring: shared by the GRPO step, the supervised
    step and the old / reference log-probs, so all of them score tokens the same way."""

    response_len: int = 0
    """Response columns T >= 0: only the last T columns of every row are scored (the output
    head runs on hidden states [L - T - 1, L - 1)); 0 scores every column after the first."""
    temperature: float = _SAMPLING.temperature
    """Sampling temperature > 0: logits are divided by it before the log-softmax, so ratios,
    entropy and KL are those of the distribution the sampler drew from (top-k/top-p aside)."""
    vocab_chunk: int = 8192
    """Vocabulary chunk >= 1 of the log-prob computation (memory vs. speed, exact either way)."""
    keep_probs: bool = False
    """Keep each micro-batch's N x V fp32 softmax from the forward for the backward (one exp
    pass and 3 vocabulary matmuls in all, not 4; N x V x 4 bytes) instead of recomputing
    it chunk by chunk (N x vocab_chunk bytes). Exact either way; the plan chooses."""
    remat: Remat = _ALGORITHM.remat
    """Activation checkpointing of the decoder blocks."""
    micro_batches: int = 1
    """Gradient-accumulation chunks >= 1 per mini-batch (the plan's `batch.micro_batches`):
    one forward/backward per chunk of rows, gradients summed, one optimizer update; the
    old / reference forwards run on chunks of the same rows."""
    fused_attention: bool = False
    """Attention through the platform's fused kernel where it applies (the plan's
    `batch.fused_attention`): on a TPU, splash attention (`locojax.kernels.tpu_attention`;
    rows of a multiple of 128 tokens, no sliding layers); on a GPU cuDNN's, chosen for
    16-bit compute either way (`locojax.model.attention`)."""
    activation_sharding: Sharding | None = None
    """The forward's B x L x D activations held to this sharding (the step makers set the
    batch's: rows over the data and FSDP axes, hidden replicated); None leaves the layout to
    the compiler, which under FSDP laid them out hidden-sharded with the whole batch on
    every device (measured with the TPU compiler; docs/aot.md)."""

    def __post_init__(self):
        if self.response_len < 0:
            raise ValueError(f"response_len={self.response_len} must be >= 0")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature} must be > 0")
        if self.vocab_chunk < 1 or self.micro_batches < 1:
            raise ValueError(f"vocab_chunk={self.vocab_chunk} and micro_batches="
                             f"{self.micro_batches} must be >= 1")
        object.__setattr__(self, "remat", Remat(self.remat))


LOG_RATIO_BOUND = 20.0
"""Every log-ratio is clamped to [-20, 20] before its exp (verl's bound): the PPO ratio, the
behaviour weight's and the k3 KL's, so no exp overflows and no gradient turns into NaN."""
KL_LOG_RATIO_BOUND = LOG_RATIO_BOUND
"""|log pi_ref - log pi| is clamped to this before the exp of the k3 KL (no overflow)."""
KL_TERM_MAX = 10.0
"""Upper clamp of each token's k3 KL term (k3 >= 0, so its range is [0, 10]; verl: [-10, 10])."""


@dataclass(frozen=True)
class Bounds:
    """The bounds of a correction's weight."""

    cap: float = 2.0
    """Token level: the clamp of `tis`, the upper edge of `mis`. > 0."""
    low: float = 0.0
    """Token level: the lower edge of `mis` (0: 1 / cap). >= 0."""
    seq_cap: float = 2.0
    """Sequence level: the clamp of `seq_tis`, the upper edge of `seq_mis`. > 0."""
    seq_low: float = 0.0
    """Sequence level: the lower edge of `seq_mis` (0: none, Liu, Li et al.'s
    rho * 1{rho <= C}). >= 0."""

    def of(self, per_sequence: bool) -> tuple[float, float]:
        """(cap, lower edge) of the sequence level or the token level."""
        if per_sequence:
            return self.seq_cap, self.seq_low
        return self.cap, self.low or 1.0 / self.cap


@dataclass(frozen=True)
class GrpoSettings:
    """GRPO loss and update settings (mirrors the config's `algorithm` group)."""

    clip_eps: float = _ALGORITHM.clip_eps
    """Lower clip of the importance ratio, 1 - eps."""
    clip_eps_high: float = _ALGORITHM.clip_eps_high
    """Upper clip of the importance ratio, 1 + eps_high."""
    kl_coef: float = _ALGORITHM.kl_coef
    """Weight of the k3 KL estimate to the reference policy (0: no reference needed)."""
    aggregation: LossAggregation = _ALGORITHM.loss_aggregation
    """How token losses are reduced."""
    max_response_len: int = _WORKLOAD.max_response_len
    """Constant of the `constant` aggregation (the workload's longest completion)."""
    optimizer_steps_per_batch: int = _ALGORITHM.optimizer_steps_per_batch
    """Mini-batches (optimizer updates) per train batch."""
    normalize_advantage_std: bool = _ALGORITHM.normalize_advantage_std
    """Divide group-centred rewards by the group std (Dr. GRPO: off)."""
    dual_clip: float = _ALGORITHM.dual_clip
    """Dual-clip constant c > 1 (0: off): for a negative advantage the surrogate is at least
    c * A, so a huge ratio on a bad token cannot dominate the step (Ye et al. 2020)."""
    loss: PolicyLoss = _ALGORITHM.loss
    """The per-token policy objective (`locojax.train.loss.POLICY_LOSSES`)."""
    ratio_level: RatioLevel = _ALGORITHM.ratio_level
    """token: r = pi(y_t) / pi_old(y_t); sequence: GSPO's exp(mean_t log(pi / pi_old)) per row,
    in its gspo-token form (`locojax.train.loss.log_ratio`)."""
    rollout_correction: RolloutCorrection = _ALGORITHM.rollout_correction
    """How each token's policy-gradient term is weighted by w = pi_old / pi_rollout,
    pi_rollout the sampler's log-prob (`TrainBatch.rollout_logp_BxL`; a batch without it has
    weight 1): `locojax.train.correction`. With pi_old the trainer's recompute this is
    decoupled PPO (AReaL): it corrects stale samples (DA), trainer/engine mismatch and
    top-k/top-p."""
    rollout_correction_cap: float = _ALGORITHM.rollout_correction_cap
    """The clamp of tis; the upper edge of mis."""
    rollout_correction_low: float = _ALGORITHM.rollout_correction_low
    """The lower edge of mis (0: 1 / cap)."""
    rollout_correction_seq_cap: float = _ALGORITHM.rollout_correction_seq_cap
    """The clamp of seq_tis; the upper edge of seq_mis (on the product of a row's ratios)."""
    rollout_correction_seq_low: float = _ALGORITHM.rollout_correction_seq_low
    """The lower edge of seq_mis (0: none)."""
    old_is_current: bool = False
    """pi_old is the policy being updated, exactly (one update per batch, pi_old recomputed):
    the loss uses the stop-gradient of its own log-probs as pi_old and the batch's
    `behaviour_logp_BxL` (or `rollout_logp_BxL`) as the sampler's; no pi_old forward runs.
    The coordination layer sets it from `AlgorithmConfig.old_forward`."""
    forward: ForwardSettings = field(default_factory=ForwardSettings)
    """How tokens are scored (response columns, temperature, chunks, remat, micro-batches)."""
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    """AdamW and schedule of the RL phase."""

    @property
    def correction(self) -> tuple[RolloutCorrection, Bounds]:
        """(kind, bounds) of the rollout correction (`correction.rollout_weight`'s)."""
        return self.rollout_correction, Bounds(
            self.rollout_correction_cap, self.rollout_correction_low,
            self.rollout_correction_seq_cap, self.rollout_correction_seq_low)

    def __post_init__(self):
        object.__setattr__(self, "ratio_level", RatioLevel(self.ratio_level))
        object.__setattr__(self, "loss", PolicyLoss(self.loss))
        if self.old_is_current and self.optimizer_steps_per_batch != 1:
            raise ValueError(f"old_is_current needs one update per batch, not "
                             f"{self.optimizer_steps_per_batch}")
        if self.dual_clip != 0 and not self.dual_clip > 1:
            raise ValueError(f"dual_clip={self.dual_clip} must be 0 (off) or > 1")
        if self.dual_clip and self.loss not in DUAL_CLIP_LOSSES:
            raise ValueError(f"dual_clip={self.dual_clip}: the {self.loss} loss has none")
        object.__setattr__(self, "rollout_correction",
                           RolloutCorrection(self.rollout_correction))
        for cap, low in (("rollout_correction_cap", "rollout_correction_low"),
                         ("rollout_correction_seq_cap", "rollout_correction_seq_low")):
            if not getattr(self, cap) > 0 or getattr(self, low) < 0:
                raise ValueError(f"{cap}={getattr(self, cap)} must be > 0 and "
                                 f"{low}={getattr(self, low)} >= 0")

"""Typed runtime settings of the trainer (built by the coordination layer from the plan)."""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.vocab import LossAggregation, LrSchedule


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW, schedule and gradient clipping of one training phase (RL or SFT)."""

    learning_rate: float = 1e-6
    """Peak learning rate."""
    schedule: LrSchedule = LrSchedule.constant
    """Shape after warm-up."""
    warmup_steps: int = 0
    """Optimizer updates of linear warm-up from 0 to the peak."""
    total_steps: int = 1
    """Optimizer updates of the whole phase (cosine horizon, warm-up included)."""
    min_lr_ratio: float = 0.1
    """Cosine floor as a fraction of the peak."""
    weight_decay: float = 0.0
    """Decoupled weight decay (not applied to norm scales)."""
    b1: float = 0.9
    """First-moment decay."""
    b2: float = 0.999
    """Second-moment decay."""
    eps: float = 1e-8
    """Adam denominator epsilon."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0: off)."""


@dataclass(frozen=True)
class GrpoSettings:
    """GRPO loss and update settings (mirrors the config's `algorithm` group)."""

    clip_eps: float = 0.2
    """Lower clip of the importance ratio, 1 - eps."""
    clip_eps_high: float = 0.2
    """Upper clip of the importance ratio, 1 + eps_high."""
    kl_coef: float = 0.0
    """Weight of the k3 KL estimate to the reference policy (0: no reference needed)."""
    aggregation: LossAggregation = LossAggregation.token_mean
    """How token losses are reduced."""
    max_response_len: int = 16
    """Constant of the `constant` aggregation (the workload's longest completion)."""
    optimizer_steps_per_batch: int = 1
    """Mini-batches (optimizer updates) per train batch."""
    normalize_advantage_std: bool = True
    """Divide group-centred rewards by the group std (Dr. GRPO: off)."""
    vocab_chunk: int = 8192
    """Vocabulary chunk of the log-prob computation (memory vs. speed, exact either way)."""
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    """AdamW and schedule of the RL phase."""

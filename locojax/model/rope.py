"""RoPE frequency tables of Hugging Face's `rope_type`s, computed once on the host in numpy.

    RopeScaling (compiler.sections, in compiler.config's schema: kind, factor, ...)
        │
        ▼
    rope_frequencies(head_dim, theta, scaling)          float64 throughout, one cast at the end
        inv_freq_R = theta^(-2i/head_dim)  ──►  _TABLES[kind]
            default: unchanged                          attention_scale 1
            linear:  / factor                           attention_scale 1
            llama3:  per wavelength band                attention_scale 1
            yarn:    ramp between / factor and kept     attention_scale = attention_factor
        │
        ▼
    (inv_freq_R float32 numpy, attention_scale)  ──►  layers.rope_cos_sin: cos, sin × scale

R = head_dim / 2 rotation pairs. The formulas are those of transformers'
`src/transformers/modeling_rope_utils.py` (`_compute_default_rope_parameters`,
`_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`,
`_compute_yarn_parameters`): huggingface/transformers at ef468064 (a 4.4x release) for
default, linear and llama3, and the yarn of the releases after huggingface/transformers#40320
(late 4.5x, 5.x).
Transformers computes them in float32 torch; here they are computed in float64 and rounded
once, within ~1 float32 ULP (~1e-7 relative) of transformers' tables.

YaRN, as in those releases: `factor` is used as given (earlier 4.5x releases replaced it by
max_position_embeddings / original_max_position_embeddings whenever the latter was set,
huggingface/transformers#38224, which left the common "factor 4, original 32768,
max_position_embeddings 32768" configs unscaled; 5.x derives it so only when `factor` is
absent); the correction range comes from `original_max_position` and is truncated
(floor / ceil: transformers' `truncate=True`, its default); the attention scale is
`attention_factor`, else 0.1 ln(factor) + 1 for factor > 1, else 1 (DeepSeek's `mscale` /
`mscale_all_dim` are not supported). Transformers takes `max_position_embeddings` where
`original_max_position_embeddings` is absent: the caller fills `original_max_position` so.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from compiler.sections import RopeScaling
from compiler.vocab import RopeKind

__all__ = ["UNSCALED", "RopeKind", "RopeScaling", "rope_frequencies"]

UNSCALED = RopeScaling()
"""Plain RoPE (`RopeKind.default`): the default of every function taking a `RopeScaling`."""


def _unscaled_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """float64 theta^(-2i/head_dim) for i in [0, head_dim/2): shape R."""
    return 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def _default(head_dim: int, theta: float, scaling: RopeScaling) -> tuple[np.ndarray, float]:
    return _unscaled_inv_freq(head_dim, theta), 1.0


def _linear(head_dim: int, theta: float, scaling: RopeScaling) -> tuple[np.ndarray, float]:
    return _unscaled_inv_freq(head_dim, theta) / scaling.factor, 1.0


def _llama3(head_dim: int, theta: float, scaling: RopeScaling) -> tuple[np.ndarray, float]:
    """Wavelengths longer than original / low_freq_factor: / factor; shorter than
    original / high_freq_factor: kept; between: a blend linear in original / wavelength."""
    s = scaling
    inv_freq_R = _unscaled_inv_freq(head_dim, theta)
    wavelen_R = 2 * math.pi / inv_freq_R
    low_freq_wavelen = s.original_max_position / s.low_freq_factor
    high_freq_wavelen = s.original_max_position / s.high_freq_factor
    smooth_R = ((s.original_max_position / wavelen_R - s.low_freq_factor)
                / (s.high_freq_factor - s.low_freq_factor))
    blended_R = (1 - smooth_R) * inv_freq_R / s.factor + smooth_R * inv_freq_R
    scaled_R = np.where(wavelen_R > low_freq_wavelen, inv_freq_R / s.factor,
                        np.where(wavelen_R < high_freq_wavelen, inv_freq_R, blended_R))
    return scaled_R, 1.0


def _yarn_correction_dim(rotations: float, head_dim: int, theta: float, positions: int) -> float:
    """The (fractional) pair index i whose frequency turns `rotations` times over `positions`."""
    return head_dim * math.log(positions / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def _yarn(head_dim: int, theta: float, scaling: RopeScaling) -> tuple[np.ndarray, float]:
    """Dims below the correction range (fast, > beta_fast turns) keep their frequency, dims
    above it (slow, < beta_slow turns) are divided by `factor`, a linear ramp between."""
    s = scaling
    low = max(math.floor(_yarn_correction_dim(s.beta_fast, head_dim, theta,
                                              s.original_max_position)), 0)
    high = min(math.ceil(_yarn_correction_dim(s.beta_slow, head_dim, theta,
                                              s.original_max_position)), head_dim - 1)
    span = high - low if high != low else 0.001  # transformers' guard against a 0 division
    ramp_R = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / span, 0.0, 1.0)
    inv_freq_R = _unscaled_inv_freq(head_dim, theta)
    scaled_R = inv_freq_R / s.factor * ramp_R + inv_freq_R * (1.0 - ramp_R)
    mscale = 0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0
    return scaled_R, mscale if s.attention_factor is None else float(s.attention_factor)


_TABLES: dict[RopeKind, Callable[[int, float, RopeScaling], tuple[np.ndarray, float]]] = {
    RopeKind.default: _default,
    RopeKind.linear: _linear,
    RopeKind.llama3: _llama3,
    RopeKind.yarn: _yarn,
}
"""Each kind's float64 (inv_freq_R, attention_scale)."""


def _problems(head_dim: int, theta: float, s: RopeScaling) -> list[str]:
    """What makes the arguments unusable (empty when they are fine)."""
    banded = s.kind in (RopeKind.llama3, RopeKind.yarn)
    checks = [
        (head_dim >= 2 and head_dim % 2 == 0, f"head_dim={head_dim} must be even and >= 2"),
        (theta > 0 and math.isfinite(theta), f"theta={theta} must be finite and > 0"),
        (s.kind is RopeKind.default or (math.isfinite(s.factor) and s.factor > 0),
         f"factor={s.factor} must be finite and > 0"),
        (not banded or s.original_max_position >= 1,
         f"{s.kind} needs original_max_position >= 1, got {s.original_max_position}"),
        (s.kind is not RopeKind.llama3 or 0 < s.low_freq_factor < s.high_freq_factor,
         f"llama3 needs 0 < low_freq_factor={s.low_freq_factor} < "
         f"high_freq_factor={s.high_freq_factor}"),
        (s.kind is not RopeKind.yarn or (s.beta_fast > 0 and s.beta_slow > 0),
         f"yarn needs beta_fast={s.beta_fast} and beta_slow={s.beta_slow} > 0"),
        (s.kind is not RopeKind.yarn or s.attention_factor is None or s.attention_factor > 0,
         f"yarn needs attention_factor={s.attention_factor} > 0 (or None)"),
    ]
    return [message for ok, message in checks if not ok]


def rope_frequencies(head_dim: int, theta: float,
                     scaling: RopeScaling = UNSCALED) -> tuple[np.ndarray, float]:
    """(inv_freq_R, attention_scale) of RoPE with `scaling`, as transformers computes them.

    inv_freq_R: float32 numpy array of head_dim / 2 inverse frequencies (angle of pair i at
    position p is p * inv_freq_R[i]); attention_scale: the float cos and sin are multiplied
    by (1 except for yarn). Computed in float64 and rounded once to float32, which matches
    transformers' float32 tables to ~1e-7 relative (`layers.rope_cos_sin` keeps its own
    float32 formula for the default kind). Fields the kind does not read are ignored.
    Raises ValueError for an odd head_dim, theta <= 0, or a kind's parameters out of range.
    """
    problems = _problems(head_dim, theta, scaling)
    if problems:
        raise ValueError("rope_frequencies: " + "; ".join(problems))
    inv_freq_R, attention_scale = _TABLES[scaling.kind](head_dim, theta, scaling)
    return inv_freq_R.astype(np.float32), float(attention_scale)

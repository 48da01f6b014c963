"""RoPE scaling: `rope_frequencies` against references written here from the definitions.

    definition (Meta's Llama 3.1 `apply_scaling`, YaRN's correction range and ramp)
        per-pair float64 loops in this file  ──┐
                                               ├── max relative difference < 1e-6
    locojax.model.rope.rope_frequencies  ──────┘
    layers.rope_cos_sin(default)  ==  the formula it had before scaling existed, bit for bit

The configurations are published ones: Llama-3.2-1B's `rope_scaling` (llama3, factor 32,
low 1, high 4, original 8192, theta 500000, head_dim 64) and Qwen2.5's documented YaRN
long-context entry (factor 4, original 32768, theta 1e6, head_dim 128).
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compiler.config import RopeKind, RopeScaling
from locojax.model.layers import rope_cos_sin
from locojax.model.rope import rope_frequencies

LLAMA32_1B = RopeScaling(kind=RopeKind.llama3, factor=32.0, original_max_position=8192,
                         low_freq_factor=1.0, high_freq_factor=4.0)
LLAMA32_1B_HEAD_DIM, LLAMA32_1B_THETA = 64, 500_000.0
QWEN25_YARN = RopeScaling(kind=RopeKind.yarn, factor=4.0, original_max_position=32768)
QWEN25_HEAD_DIM, QWEN25_THETA = 128, 1_000_000.0


def _old_rope_cos_sin(positions_BxL, head_dim, theta):
    """`layers.rope_cos_sin` as it was before RoPE scaling."""
    exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    angles_BxLxR = positions_BxL.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(angles_BxLxR), jnp.sin(angles_BxLxR)


def _plain_ref(head_dim: int, theta: float) -> list[float]:
    """RoFormer's frequencies, pair by pair: theta_i = theta^(-2i/d)."""
    return [theta ** (-2.0 * i / head_dim) for i in range(head_dim // 2)]


def _llama3_ref(head_dim: int, theta: float, s: RopeScaling) -> np.ndarray:
    """Meta's Llama 3.1 `apply_scaling`, one frequency at a time."""
    out = []
    for freq in _plain_ref(head_dim, theta):
        wavelen = 2 * math.pi / freq
        if wavelen < s.original_max_position / s.high_freq_factor:  # high frequency: kept
            out.append(freq)
        elif wavelen > s.original_max_position / s.low_freq_factor:  # low frequency: / factor
            out.append(freq / s.factor)
        else:  # between: linear in the number of turns over the original context
            smooth = ((s.original_max_position / wavelen - s.low_freq_factor)
                      / (s.high_freq_factor - s.low_freq_factor))
            out.append((1 - smooth) * freq / s.factor + smooth * freq)
    return np.asarray(out)


def _yarn_ref(head_dim: int, theta: float, s: RopeScaling) -> tuple[np.ndarray, float]:
    """YaRN by the reference implementation's definition: pair i turns
    L / (2 pi theta^(2i/d)) times over the original context L; the pair that turns r times is
    i(r) = (d / 2) log_theta(L / (2 pi r)). Pairs up to floor(i(beta_fast)) keep their
    frequency, pairs from ceil(i(beta_slow)) are interpolated (/ s), a linear ramp between."""
    def pair_turning(r: float) -> float:
        return head_dim / 2 * (np.log(s.original_max_position / (2 * np.pi * r)) / np.log(theta))

    first = max(math.floor(pair_turning(s.beta_fast)), 0)
    last = min(math.ceil(pair_turning(s.beta_slow)), head_dim - 1)
    out = []
    for i, freq in enumerate(_plain_ref(head_dim, theta)):
        gamma = min(max((i - first) / (last - first), 0.0), 1.0)  # 0: kept, 1: interpolated
        out.append((1 - gamma) * freq + gamma * freq / s.factor)
    mscale = 1 + 0.1 * math.log(s.factor) if s.factor > 1 else 1.0
    return np.asarray(out), mscale


def _max_rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want) / np.abs(want)))


@pytest.mark.parametrize("head_dim,theta", [(64, 500_000.0), (128, 1e6), (16, 10_000.0)])
def test_default_kind_is_the_old_formula_bit_for_bit(head_dim, theta):
    positions_BxL = jax.random.randint(jax.random.key(head_dim), (3, 37), 0, 40960)
    want = _old_rope_cos_sin(positions_BxL, head_dim, theta)
    for scaling in (None, RopeScaling(), RopeScaling(factor=8.0, original_max_position=99)):
        got = (rope_cos_sin(positions_BxL, head_dim, theta) if scaling is None
               else rope_cos_sin(positions_BxL, head_dim, theta, scaling))
        for g, w in zip(got, want, strict=True):
            assert g.dtype == jnp.float32 and g.shape == (3, 37, head_dim // 2)
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_default_frequencies_are_theta_powers():
    inv_freq_R, scale = rope_frequencies(128, 1e6, RopeScaling())
    assert inv_freq_R.dtype == np.float32 and inv_freq_R.shape == (64,) and scale == 1.0
    assert _max_rel(inv_freq_R, np.asarray(_plain_ref(128, 1e6))) < 1e-6


def test_linear_divides_every_frequency_by_factor():
    scaling = RopeScaling(kind=RopeKind.linear, factor=8.0)
    inv_freq_R, scale = rope_frequencies(64, 10_000.0, scaling)
    want = np.asarray(_plain_ref(64, 10_000.0)) / 8.0
    assert scale == 1.0 and _max_rel(inv_freq_R, want) < 1e-6
    plain_R, _ = rope_frequencies(64, 10_000.0)
    np.testing.assert_allclose(plain_R / inv_freq_R, 8.0, rtol=1e-6)


def test_llama3_matches_meta_definition_for_llama32_1b():
    inv_freq_R, scale = rope_frequencies(LLAMA32_1B_HEAD_DIM, LLAMA32_1B_THETA, LLAMA32_1B)
    want = _llama3_ref(LLAMA32_1B_HEAD_DIM, LLAMA32_1B_THETA, LLAMA32_1B)
    assert inv_freq_R.shape == (32,) and scale == 1.0
    assert _max_rel(inv_freq_R, want) < 1e-6
    plain = np.asarray(_plain_ref(LLAMA32_1B_HEAD_DIM, LLAMA32_1B_THETA))
    # Wavelength 2 pi 500000^(i/32) < 2048 for i <= 14 (kept), > 8192 for i >= 18 (/ 32).
    assert _max_rel(inv_freq_R[:15], plain[:15]) < 1e-6
    assert inv_freq_R[0] == 1.0  # the highest frequency, exactly unchanged
    np.testing.assert_allclose(plain[18:] / inv_freq_R[18:], 32.0, rtol=1e-6)
    assert plain[-1] / inv_freq_R[-1] == pytest.approx(32.0, rel=1e-7)  # lowest: / factor
    ratio_medium = plain[15:18] / inv_freq_R[15:18]  # strictly between kept and / 32
    assert np.all(ratio_medium > 1.0) and np.all(ratio_medium < 32.0)
    assert np.all(np.diff(ratio_medium) > 0)


def test_llama3_pinned_values_for_llama32_1b():
    """Values traced by hand: inv_freq_i = 500000^(-i/32) before scaling."""
    inv_freq_R, _ = rope_frequencies(LLAMA32_1B_HEAD_DIM, LLAMA32_1B_THETA, LLAMA32_1B)
    # i = 0: 500000^0 = 1, wavelength 2 pi < 2048: kept.
    assert inv_freq_R[0] == 1.0
    # i = 8: 500000^(-1/4) = 1 / 26.5915 = 0.0376060; wavelength 167.1 < 2048: kept.
    assert inv_freq_R[8] == pytest.approx(0.0376060309, rel=1e-6)
    # i = 16: 500000^(-1/2) = sqrt(2) / 1000 = 1.41421356e-3; wavelength 2 pi 707.107 = 4442.88
    # is in [2048, 8192]: smooth = (8192 / 4442.88 - 1) / (4 - 1) = 0.2812826, and
    # 1.41421356e-3 * ((1 - 0.2812826) / 32 + 0.2812826) = 4.2955680e-4.
    smooth = (8192 * math.sqrt(2) / 1000 / (2 * math.pi) - 1) / 3
    assert smooth == pytest.approx(0.2812826, abs=1e-7)
    assert inv_freq_R[16] == pytest.approx(math.sqrt(2) / 1000 * ((1 - smooth) / 32 + smooth),
                                           rel=1e-6)
    assert inv_freq_R[16] == pytest.approx(4.2955680e-4, rel=1e-6)
    # i = 24: 500000^(3/4) = 18803.015; wavelength 2 pi 18803 > 8192: 1 / (18803.015 * 32).
    assert inv_freq_R[24] == pytest.approx(1.66196747e-6, rel=1e-6)


def test_yarn_matches_its_definition_for_qwen25():
    inv_freq_R, scale = rope_frequencies(QWEN25_HEAD_DIM, QWEN25_THETA, QWEN25_YARN)
    want, want_scale = _yarn_ref(QWEN25_HEAD_DIM, QWEN25_THETA, QWEN25_YARN)
    assert inv_freq_R.shape == (64,) and _max_rel(inv_freq_R, want) < 1e-6
    assert scale == pytest.approx(want_scale, rel=1e-12)
    assert scale == pytest.approx(0.1 * math.log(4) + 1, rel=1e-12)  # 1.1386294
    assert scale == pytest.approx(1.1386294361, rel=1e-9)
    plain = np.asarray(_plain_ref(QWEN25_HEAD_DIM, QWEN25_THETA))
    # i(32) = 64 ln(32768 / (64 pi)) / ln(1e6) = 23.6 -> 23; i(1) = 39.65 -> 40.
    assert _max_rel(inv_freq_R[:24], plain[:24]) < 1e-6  # turning > 32 times: kept
    np.testing.assert_allclose(plain[40:] / inv_freq_R[40:], 4.0, rtol=1e-6)  # < 1 turn: / 4
    ratio_ramp = plain[24:40] / inv_freq_R[24:40]
    assert np.all(np.diff(ratio_ramp) > 0) and ratio_ramp[0] > 1 and ratio_ramp[-1] < 4


def test_yarn_attention_factor_and_factor_are_taken_as_given():
    given = dataclasses.replace(QWEN25_YARN, attention_factor=0.75)
    assert rope_frequencies(QWEN25_HEAD_DIM, QWEN25_THETA, given)[1] == 0.75
    # factor <= 1 has no mscale; factor 1 interpolates nothing.
    unit = dataclasses.replace(QWEN25_YARN, factor=1.0)
    inv_freq_R, scale = rope_frequencies(QWEN25_HEAD_DIM, QWEN25_THETA, unit)
    assert scale == 1.0
    assert _max_rel(inv_freq_R, np.asarray(_plain_ref(QWEN25_HEAD_DIM, QWEN25_THETA))) < 1e-6


def _transformers_float32(head_dim: int, theta: float, s: RopeScaling) -> np.ndarray:
    """The float32 arithmetic transformers does (torch float32 tensors, Python-float scalars),
    step by step in numpy float32."""
    f32 = np.float32
    exps = np.arange(0, head_dim, 2).astype(f32) / f32(head_dim)
    inv = f32(1.0) / (f32(theta) ** exps)
    if s.kind is RopeKind.llama3:
        wavelen = f32(2 * math.pi) / inv
        low_wl = s.original_max_position / s.low_freq_factor
        high_wl = s.original_max_position / s.high_freq_factor
        llama = np.where(wavelen > f32(low_wl), inv / f32(s.factor), inv)
        smooth = ((f32(s.original_max_position) / wavelen - f32(s.low_freq_factor))
                  / f32(s.high_freq_factor - s.low_freq_factor))
        blended = (f32(1) - smooth) * llama / f32(s.factor) + smooth * llama
        medium = ~(wavelen < f32(high_wl)) & ~(wavelen > f32(low_wl))
        return np.where(medium, blended, llama)
    pos = f32(theta) ** exps
    first, last = 23, 40  # Qwen2.5's correction range, see test_yarn_matches_its_definition
    ramp = np.clip((np.arange(head_dim // 2, dtype=f32) - f32(first)) / f32(last - first), 0, 1)
    extrapolation = f32(1) - ramp
    return (f32(1) / (f32(s.factor) * pos)) * (f32(1) - extrapolation) + (f32(1) / pos) * extrapolation


@pytest.mark.parametrize("head_dim,theta,scaling", [
    (LLAMA32_1B_HEAD_DIM, LLAMA32_1B_THETA, LLAMA32_1B),
    (QWEN25_HEAD_DIM, QWEN25_THETA, QWEN25_YARN),
])
def test_frequencies_match_transformers_float32_arithmetic(head_dim, theta, scaling):
    """Transformers' tables are float32 throughout; float64 rounded once lies within
    a few float32 ULPs (2^-24 = 6e-8 relative each) of them."""
    got, _ = rope_frequencies(head_dim, theta, scaling)
    want = _transformers_float32(head_dim, theta, scaling)
    assert want.dtype == np.float32
    assert _max_rel(got, want.astype(np.float64)) < 5e-7


def test_rope_cos_sin_applies_scaled_frequencies_and_attention_scale():
    positions_BxL = jnp.asarray([[0, 1, 4095], [70000, 12, 131071]], dtype=jnp.int32)
    cos_BxLxR, sin_BxLxR = jax.jit(rope_cos_sin, static_argnums=(1, 2, 3))(
        positions_BxL, QWEN25_HEAD_DIM, QWEN25_THETA, QWEN25_YARN)
    inv_freq, scale = _yarn_ref(QWEN25_HEAD_DIM, QWEN25_THETA, QWEN25_YARN)
    angles = np.asarray(positions_BxL, dtype=np.float64)[..., None] * inv_freq
    assert cos_BxLxR.dtype == jnp.float32 and cos_BxLxR.shape == (2, 3, 64)
    np.testing.assert_allclose(cos_BxLxR[0, 0], scale, rtol=1e-7)  # position 0: cos 1 x scale
    # float32 angles near 1.3e5 carry ~1e-2 absolute error in the fastest pair.
    np.testing.assert_allclose(cos_BxLxR, scale * np.cos(angles), atol=2e-2)
    np.testing.assert_allclose(sin_BxLxR, scale * np.sin(angles), atol=2e-2)
    np.testing.assert_allclose(cos_BxLxR[:, :, 40:], scale * np.cos(angles)[:, :, 40:], atol=1e-5)
    llama_cos, _ = rope_cos_sin(positions_BxL, LLAMA32_1B_HEAD_DIM, LLAMA32_1B_THETA,
                                LLAMA32_1B)
    assert float(jnp.max(jnp.abs(llama_cos))) <= 1.0  # no attention scale


@pytest.mark.parametrize("scaling,head_dim,theta,words", [
    (dataclasses.replace(LLAMA32_1B, original_max_position=0), 64, 5e5, "original_max_position"),
    (dataclasses.replace(QWEN25_YARN, original_max_position=0), 128, 1e6, "original_max_position"),
    (dataclasses.replace(LLAMA32_1B, high_freq_factor=1.0), 64, 5e5, "low_freq_factor"),
    (RopeScaling(kind=RopeKind.linear, factor=0.0), 64, 1e4, "factor"),
    (RopeScaling(), 63, 1e4, "head_dim"),
    (RopeScaling(), 64, 0.0, "theta"),
])
def test_unusable_arguments_are_refused(scaling, head_dim, theta, words):
    with pytest.raises(ValueError, match=words):
        rope_frequencies(head_dim, theta, scaling)

"""The sampler draws exactly from softmax, top-k and top-p distributions, and greedy is argmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.rollout.sampler import (
    CHUNK,
    SamplingSettings,
    inverse_cdf,
    nucleus_threshold,
    sample,
    top_k,
)

DRAWS = 200_000
ROWS = 20_000  # draws per compiled call; 10 calls


def _draw_counts(logits_V: np.ndarray, settings: SamplingSettings, seed: int = 0):
    """Counts of DRAWS samples of one logit row, and the (id, logp, logp_model) of each call."""
    f = jax.jit(lambda x, k: sample(x, k, settings))
    x_BxV = jnp.broadcast_to(jnp.asarray(logits_V, jnp.float32), (ROWS, len(logits_V)))
    counts = np.zeros(len(logits_V), np.int64)
    ids, logps, model_logps = [], [], []
    for i in range(DRAWS // ROWS):
        d = f(x_BxV, jax.random.key(seed * 1000 + i))
        ids.append(np.asarray(d.ids_B))
        logps.append(np.asarray(d.logp_B))
        model_logps.append(np.asarray(d.logp_model_B))
    ids = np.concatenate(ids)
    counts += np.bincount(ids, minlength=len(logits_V))
    return counts, ids, np.concatenate(logps), np.concatenate(model_logps)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _assert_matches(counts: np.ndarray, probs: np.ndarray):
    """Chi-square over the support within 6 sigma, no draws outside it, and a small TV distance."""
    support = probs > 0
    assert counts[~support].sum() == 0, "drew a token of zero probability"
    expected = probs * counts.sum()
    # Tokens expected fewer than 20 times are pooled into one bin so chi-square stays valid.
    rare = support & (expected < 20)
    obs = np.append(counts[support & ~rare], counts[rare].sum())
    exp = np.append(expected[support & ~rare], expected[rare].sum())
    obs, exp = (obs, exp) if rare.any() else (obs[:-1], exp[:-1])
    assert len(exp) > 3, "test design: too few bins"
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    dof = len(exp) - 1
    assert chi2 < dof + 6 * np.sqrt(2 * dof), f"chi2={chi2:.1f} for {dof} degrees of freedom"
    tv = 0.5 * np.abs(counts / counts.sum() - probs).sum()
    assert tv < 0.02, f"total variation {tv:.4f}"


def _logits(v: int) -> np.ndarray:
    i = np.arange(v)
    return (1.5 * np.sin(0.37 * i) + i / v).astype(np.float32)


def test_full_vocabulary_matches_softmax():
    logits = _logits(300)
    counts, ids, logp, logp_model = _draw_counts(logits, SamplingSettings())
    probs = _softmax(logits.astype(np.float64))
    _assert_matches(counts, probs)
    np.testing.assert_allclose(logp, np.log(probs[ids]), atol=1e-5)
    np.testing.assert_array_equal(logp, logp_model)


def test_chunk_boundaries_and_padding():
    # Mass on both sides of every chunk boundary and on the last token of a padded chunk.
    v = 2 * CHUNK + 44
    logits = np.full(v, -2.0, np.float32)
    logits[[0, CHUNK - 1, CHUNK, 2 * CHUNK - 1, 2 * CHUNK, v - 1]] = [1.0, 2.0, 1.5, 0.5, 2.5, 3.0]
    counts, *_ = _draw_counts(logits, SamplingSettings(), seed=1)
    _assert_matches(counts, _softmax(logits.astype(np.float64)))


def test_a_shifted_sampler_fails_the_check():
    # The statistical check has power: off-by-one token ids are rejected.
    logits = _logits(300)
    counts, *_ = _draw_counts(logits, SamplingSettings(), seed=2)
    with pytest.raises(AssertionError):
        _assert_matches(np.roll(counts, 1), _softmax(logits.astype(np.float64)))


def test_temperature_scales_logits():
    logits = _logits(300)
    counts, ids, logp, logp_model = _draw_counts(logits, SamplingSettings(temperature=0.5), 3)
    _assert_matches(counts, _softmax(logits.astype(np.float64) / 0.5))
    np.testing.assert_allclose(logp, np.log(_softmax(logits / 0.5)[ids]), atol=1e-5)
    # The model log-prob is at the sampling temperature (what the trainer scores).
    np.testing.assert_allclose(logp_model, np.log(_softmax(logits / 0.5)[ids]), atol=1e-5)


def test_top_k_renormalises_among_k():
    logits = _logits(300)
    k = 7
    counts, ids, logp, _ = _draw_counts(logits, SamplingSettings(top_k=k), seed=4)
    keep = np.argsort(-logits)[:k]
    probs = np.zeros(300)
    probs[keep] = _softmax(logits[keep].astype(np.float64))
    _assert_matches(counts, probs)
    np.testing.assert_allclose(logp, np.log(probs[ids]), atol=1e-5)


def _nucleus_probs(logits: np.ndarray, top_p: float) -> np.ndarray:
    p = _softmax(logits.astype(np.float64))
    order = np.argsort(-p)
    before = np.cumsum(p[order]) - p[order]
    keep = order[before < top_p]
    out = np.zeros_like(p)
    out[keep] = p[keep] / p[keep].sum()
    return out


def test_top_p_keeps_the_nucleus_only():
    logits = 2.0 * _logits(300)
    probs = _nucleus_probs(logits, 0.5)
    assert 5 < (probs > 0).sum() < 150, "test design: the nucleus should be a strict subset"
    counts, ids, logp, _ = _draw_counts(logits, SamplingSettings(top_p=0.5), seed=5)
    _assert_matches(counts, probs)
    np.testing.assert_allclose(logp, np.log(probs[ids]), atol=1e-4)


def test_top_k_then_top_p():
    logits = 2.0 * _logits(300)
    k = 20
    keep = np.argsort(-logits)[:k]
    sub = _nucleus_probs(logits[keep], 0.7)
    probs = np.zeros(300)
    probs[keep] = sub
    counts, *_ = _draw_counts(logits, SamplingSettings(top_k=k, top_p=0.7), seed=6)
    _assert_matches(counts, probs)


def test_greedy_is_argmax():
    x_BxV = jax.random.normal(jax.random.key(0), (64, 5000)) * 3
    d = jax.jit(lambda x, k: sample(x, k, SamplingSettings(temperature=0.0)))(
        x_BxV, jax.random.key(1)
    )
    np.testing.assert_array_equal(d.ids_B, np.argmax(np.asarray(x_BxV), axis=-1))
    np.testing.assert_array_equal(d.logp_B, 0.0)
    want = jax.nn.log_softmax(x_BxV)[jnp.arange(64), d.ids_B]
    np.testing.assert_allclose(d.logp_model_B, want, atol=1e-5)


def test_two_level_top_k_equals_full_top_k():
    x_BxV = jax.random.normal(jax.random.key(2), (8, 20_000 + 17))
    for k in (1, 10, 50):
        vals, idx = jax.jit(top_k, static_argnums=1)(x_BxV, k)
        want_vals, want_idx = jax.lax.top_k(x_BxV, k)
        np.testing.assert_array_equal(vals, want_vals)
        np.testing.assert_array_equal(idx, want_idx)


def test_nucleus_threshold_equals_sorted_cut():
    x_BxV = jax.random.normal(jax.random.key(3), (16, 3000)) * 2
    w_BxV = jnp.exp(x_BxV - x_BxV.max(-1, keepdims=True))
    for top_p in (0.1, 0.5, 0.95):
        tau_B = jax.jit(nucleus_threshold, static_argnums=1)(w_BxV, top_p)
        for row in range(16):
            want = _nucleus_probs(np.asarray(x_BxV[row]), top_p) > 0
            np.testing.assert_array_equal(np.asarray(w_BxV[row] >= tau_B[row]), want)


def test_inverse_cdf_never_draws_zero_weight():
    w_BxN = jnp.zeros((4096, 3 * CHUNK + 5)).at[:, [3, CHUNK, 3 * CHUNK + 4]].set(1.0)
    u_Bx2 = jax.random.uniform(jax.random.key(4), (4096, 2))
    ids_B, total_B = jax.jit(inverse_cdf)(w_BxN, u_Bx2)
    assert set(np.unique(ids_B)) == {3, CHUNK, 3 * CHUNK + 4}
    np.testing.assert_allclose(total_B, 3.0)


def test_settings_validate():
    with pytest.raises(ValueError, match="top_p"):
        SamplingSettings(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingSettings(temperature=-1.0)
    assert SamplingSettings(stop_ids=[1, 2]).stop_ids == (1, 2)

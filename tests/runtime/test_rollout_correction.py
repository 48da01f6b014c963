"""Issue 40, item 4: each rollout correction's weight against hand-computed values, in the loss
and on a real mismatch (the sampler's top-p draw against the trainer's full softmax)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compiler.vocab import LossAggregation, RolloutCorrection
from locojax.rollout.sampler import SamplingSettings, sample
from locojax.train.correction import rollout_weight
from locojax.train.loss import grpo_loss
from locojax.train.settings import GrpoSettings

RC = RolloutCorrection
MASK = np.array([[True, True, True, False], [True, True, False, False]])
OLD = np.zeros((2, 4), np.float32)
ROLLOUT = np.array([[-1.0, 0.5, np.log(0.3), 9.0], [0.2, -0.2, 9.0, 9.0]], np.float32)
"""w = pi_old / pi_rollout: row 0 e, e^-0.5, 1/0.3 (a padding token), row 1 e^-0.2, e^0.2."""


def _hand(kind: RC, cap: float, low: float) -> tuple[np.ndarray, float]:
    """Weights of MASK's tokens and the clipped / masked share, from w written out."""
    w = np.array([np.e, np.e ** -0.5, 1 / 0.3, np.e ** -0.2, np.e ** 0.2])
    if kind in (RC.seq_tis, RC.seq_mis):  # each row's geometric mean on its tokens
        w = np.array([(np.e * np.e ** -0.5 / 0.3) ** (1 / 3)] * 3 + [1.0, 1.0])
    if kind in (RC.tis, RC.seq_tis):
        return np.minimum(w, cap), float((w > cap).mean())
    keep = (low <= w) & (w <= cap)
    return keep.astype(float), float((~keep).mean())


@pytest.mark.parametrize("kind", [RC.tis, RC.mis, RC.seq_tis, RC.seq_mis])
@pytest.mark.parametrize("cap", [2.0, 1.5])
def test_each_correction_weighs_as_its_formula(kind, cap):
    weight, metrics = rollout_weight(OLD, ROLLOUT, MASK, kind, cap, 0.5)
    want, share = _hand(kind, cap, 0.5)
    np.testing.assert_allclose(np.asarray(weight)[MASK], want, rtol=1e-6)
    frac = "rc_mask_frac" if kind in (RC.mis, RC.seq_mis) else "rc_clip_frac"
    np.testing.assert_allclose(np.asarray(metrics[frac])[MASK].mean(), share, atol=1e-7)
    assert np.asarray(metrics[frac])[~MASK].sum() == 0.0
    np.testing.assert_allclose(np.asarray(metrics["logp_mismatch_mean"])[MASK],
                               np.abs(ROLLOUT[MASK]), rtol=1e-6)


def test_the_sequence_mean_binds_between_the_caps():
    """Row 0's geometric mean is 1.77: inside cap 2, clipped and masked at cap 1.5."""
    assert _hand(RC.seq_tis, 2.0, 0.5)[1] == 0.0 < _hand(RC.seq_tis, 1.5, 0.5)[1]
    assert _hand(RC.seq_mis, 2.0, 0.5)[1] == 0.0 < _hand(RC.seq_mis, 1.5, 0.5)[1] == 0.6
    # the default lower edge is 1 / cap: row 1's e^-0.2 = 0.82 is kept at cap 1.25 (low 0.8), not at 1.1 (0.91)
    assert float(rollout_weight(OLD, ROLLOUT, MASK, RC.mis, 1.25)[0][1, 0]) == 1.0
    assert float(rollout_weight(OLD, ROLLOUT, MASK, RC.mis, 1.1)[0][1, 0]) == 0.0


def test_none_and_no_rollout_log_probs():
    assert rollout_weight(OLD, ROLLOUT, MASK, RC.none, 2.0)[0] is None
    assert set(rollout_weight(OLD, ROLLOUT, MASK, RC.none, 2.0)[1]) == {"logp_mismatch_mean"}
    assert rollout_weight(OLD, None, MASK, RC.tis, 2.0) == (None, {})


@pytest.mark.parametrize("kind", [RC.mis, RC.seq_tis])
def test_the_loss_takes_the_weight(kind):
    rng = np.random.default_rng(0)
    logp = jnp.asarray(rng.normal(-1.0, 0.3, (2, 4)), jnp.float32)
    adv = jnp.asarray([1.0, -0.5])
    settings = GrpoSettings(rollout_correction=kind, rollout_correction_cap=1.9,
                            rollout_correction_low=0.5,
                            aggregation=LossAggregation.token_mean)
    loss, metrics = grpo_loss(logp, jnp.asarray(MASK), adv, jnp.asarray(OLD), settings,
                              rollout_logp_BxL=jnp.asarray(ROLLOUT))
    ratio = np.exp(np.asarray(logp) - OLD)
    a = np.asarray(adv)[:, None]
    surrogate = np.minimum(ratio * a, np.clip(ratio, 0.8, 1.2) * a)
    want, _ = _hand(kind, 1.9, 0.5)
    np.testing.assert_allclose(float(loss), -(want * surrogate[MASK]).mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["rc_weight_mean"]), want.mean(), rtol=1e-5)


def test_a_real_top_p_mismatch_weighs_the_kept_mass():
    """The sampler draws from softmax restricted to the nucleus, renormalised by its mass Z;
    the trainer scores with the full softmax, so w = pi_old / pi_rollout = Z on every token:
    TIS keeps Z (< 1, never clipped), MIS masks the tokens drawn where Z < low."""
    B, L, V = 8, 6, 64
    logits_NxV = 1.5 * jax.random.normal(jax.random.key(0), (B * L, V))
    drawn = jax.jit(lambda x, k: sample(x, k, SamplingSettings(top_p=0.6)))(
        logits_NxV, jax.random.key(1))
    rollout_BxL = np.asarray(drawn.logp_B).reshape(B, L)
    ids = np.asarray(drawn.ids_B)
    old_BxL = np.asarray(jax.nn.log_softmax(logits_NxV))[np.arange(B * L), ids].reshape(B, L)
    x = np.asarray(logits_NxV, np.float64)
    probs = np.exp(x - x.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    order = np.argsort(-probs, axis=1)
    sorted_p = np.take_along_axis(probs, order, 1)
    before = np.cumsum(sorted_p, 1) - sorted_p
    z_BxL = np.where(before < 0.6, sorted_p, 0.0).sum(1).reshape(B, L)
    mask = np.ones((B, L), bool)
    mask[:, -1] = np.arange(B) % 2 == 0
    tis, m_tis = rollout_weight(old_BxL, rollout_BxL, mask, RC.tis, 2.0)
    np.testing.assert_allclose(np.asarray(tis)[mask], z_BxL[mask], rtol=2e-4)
    assert float(np.asarray(m_tis["rc_clip_frac"]).sum()) == 0.0
    low = float(np.median(z_BxL[mask]))
    mis, m_mis = rollout_weight(old_BxL, rollout_BxL, mask, RC.mis, 2.0, low)
    np.testing.assert_array_equal(np.asarray(mis)[mask], (z_BxL[mask] >= low).astype(float))
    assert 0.3 < np.asarray(m_mis["rc_mask_frac"])[mask].mean() < 0.7
    seq, _ = rollout_weight(old_BxL, rollout_BxL, mask, RC.seq_tis, 2.0)
    geo_B = np.exp([np.log(z_BxL[b][mask[b]]).mean() for b in range(B)])
    np.testing.assert_allclose(np.asarray(seq)[:, 0], geo_B, rtol=2e-4)

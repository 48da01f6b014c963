"""Issue 40, item 4 and issue 60, item 4: each rollout correction's weight against the papers'
formulas computed by hand (TIS: min(rho, C); IcePop: rho on [alpha, beta], 0 outside;
Seq-TIS: min(prod rho, C); Seq-MIS: prod rho on [low, C], 0 outside), in the loss and on a
real mismatch (the sampler's top-p draw against the trainer's full softmax)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compiler.vocab import LossAggregation, RolloutCorrection
from locojax.rollout.sampler import SamplingSettings, sample
from locojax.train.correction import rollout_weight
from locojax.train.loss import grpo_loss
from locojax.train.settings import Bounds, GrpoSettings

RC = RolloutCorrection
MASK = np.array([[True, True, True, False], [True, True, False, False]])
OLD = np.zeros((2, 4), np.float32)
ROLLOUT = np.array([[-1.0, 0.5, np.log(0.3), 9.0], [0.2, -0.2, 9.0, 9.0]], np.float32)
"""w = pi_old / pi_rollout: row 0 e, e^-0.5, 1/0.3 (a padding token), row 1 e^-0.2, e^0.2."""


def _hand(kind: RC, cap: float, low: float, seq_cap: float = 3.0,
          seq_low: float = 0.0) -> tuple[np.ndarray, float]:
    """Weights of MASK's tokens and the clipped / masked share, from rho written out."""
    rho = np.array([np.e, np.e ** -0.5, 1 / 0.3, np.e ** -0.2, np.e ** 0.2])
    if kind in (RC.seq_tis, RC.seq_mis):  # each row's product of ratios, on its tokens
        row0, row1 = np.e * np.e ** -0.5 / 0.3, np.e ** -0.2 * np.e ** 0.2
        rho, cap, low = np.array([row0] * 3 + [row1] * 2), seq_cap, seq_low
    if kind in (RC.tis, RC.seq_tis):  # Yao et al.; Liu, Li et al.'s Seq-TIS
        return np.minimum(rho, cap), float((rho > cap).mean())
    keep = (low <= rho) & (rho <= cap)  # IcePop's M(rho); Seq-MIS: rho * 1{low <= rho <= C}
    return np.where(keep, rho, 0.0), float((~keep).mean())


@pytest.mark.parametrize("kind", [RC.tis, RC.mis, RC.seq_tis, RC.seq_mis])
@pytest.mark.parametrize(("cap", "seq_cap", "seq_low"), [(2.0, 3.0, 0.0), (1.5, 5.0, 1.5)])
def test_each_correction_weighs_as_its_formula(kind, cap, seq_cap, seq_low):
    weight, metrics = rollout_weight(OLD, ROLLOUT, MASK, kind,
                                     Bounds(cap, 0.5, seq_cap, seq_low))
    want, share = _hand(kind, cap, 0.5, seq_cap, seq_low)
    np.testing.assert_allclose(np.asarray(weight)[MASK], want, rtol=1e-6)
    frac = "rc_mask_frac" if kind in (RC.mis, RC.seq_mis) else "rc_clip_frac"
    np.testing.assert_allclose(np.asarray(metrics[frac])[MASK].mean(), share, atol=1e-7)
    assert np.asarray(metrics[frac])[~MASK].sum() == 0.0
    np.testing.assert_allclose(np.asarray(metrics["logp_mismatch_mean"])[MASK],
                               np.abs(ROLLOUT[MASK]), rtol=1e-6)


def test_the_formulas_by_hand():
    """Row 0's product of ratios is e^0.5 / 0.3 = 5.50: clipped at seq_cap 3 and masked, kept
    at 5 only above seq_low 1.5 (row 1's product is 1); IcePop keeps rho itself."""
    assert _hand(RC.seq_tis, 2.0, 0.5)[0][0] == 3.0
    assert _hand(RC.seq_mis, 2.0, 0.5)[1] == 0.6
    np.testing.assert_allclose(_hand(RC.seq_mis, 2.0, 0.5, 6.0, 1.5)[0],
                               [np.e ** 0.5 / 0.3] * 3 + [0.0, 0.0])
    np.testing.assert_allclose(_hand(RC.mis, 2.0, 0.5)[0],
                               [0.0, np.e ** -0.5, 0.0, np.e ** -0.2, np.e ** 0.2])
    # the default lower edge is 1 / cap: row 1's e^-0.2 = 0.82 is kept at cap 1.25 (low 0.8),
    # not at 1.1 (0.91)
    np.testing.assert_allclose(float(rollout_weight(OLD, ROLLOUT, MASK, RC.mis,
                                                    Bounds(1.25))[0][1, 0]), np.e ** -0.2)
    assert float(rollout_weight(OLD, ROLLOUT, MASK, RC.mis, Bounds(1.1))[0][1, 0]) == 0.0


def test_a_sequence_product_binds_where_a_geometric_mean_would_not():
    """A bf16-sized mismatch, 0.017 nats a token over 200 tokens: the geometric mean (1.017)
    sits inside [0.5, 2]; the product (e^3.4 = 30) is clipped by seq_tis and masked by
    seq_mis."""
    old = np.zeros((1, 200), np.float32)
    rollout = np.full((1, 200), -0.017, np.float32)
    mask = np.ones((1, 200), bool)
    tis, m = rollout_weight(old, rollout, mask, RC.seq_tis)
    np.testing.assert_allclose(np.asarray(tis), 2.0)
    assert float(np.asarray(m["rc_clip_frac"]).mean()) == 1.0
    mis, _ = rollout_weight(old, rollout, mask, RC.seq_mis)
    assert float(np.asarray(mis).max()) == 0.0


def test_none_and_no_rollout_log_probs():
    assert rollout_weight(OLD, ROLLOUT, MASK, RC.none)[0] is None
    assert set(rollout_weight(OLD, ROLLOUT, MASK, RC.none)[1]) == {"logp_mismatch_mean"}
    assert rollout_weight(OLD, None, MASK, RC.tis) == (None, {})


@pytest.mark.parametrize("kind", [RC.mis, RC.seq_tis])
def test_the_loss_takes_the_weight(kind):
    rng = np.random.default_rng(0)
    logp = jnp.asarray(rng.normal(-1.0, 0.3, (2, 4)), jnp.float32)
    adv = jnp.asarray([1.0, -0.5])
    settings = GrpoSettings(rollout_correction=kind, rollout_correction_cap=1.9,
                            rollout_correction_low=0.5, rollout_correction_seq_cap=3.0,
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
    tis, m_tis = rollout_weight(old_BxL, rollout_BxL, mask, RC.tis)
    np.testing.assert_allclose(np.asarray(tis)[mask], z_BxL[mask], rtol=2e-4)
    assert float(np.asarray(m_tis["rc_clip_frac"]).sum()) == 0.0
    low = float(np.median(z_BxL[mask]))
    mis, m_mis = rollout_weight(old_BxL, rollout_BxL, mask, RC.mis, Bounds(2.0, low))
    np.testing.assert_allclose(np.asarray(mis)[mask],
                               np.where(z_BxL[mask] >= low, z_BxL[mask], 0.0), rtol=2e-4)
    assert 0.3 < np.asarray(m_mis["rc_mask_frac"])[mask].mean() < 0.7
    seq, _ = rollout_weight(old_BxL, rollout_BxL, mask, RC.seq_tis)
    prod_B = np.exp([np.log(z_BxL[b][mask[b]]).sum() for b in range(B)])
    np.testing.assert_allclose(np.asarray(seq)[:, 0], np.minimum(prod_B, 2.0), rtol=2e-4)

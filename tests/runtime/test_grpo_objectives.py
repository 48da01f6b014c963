"""The objectives of issue 31 against independent formulas: decoupled PPO on lagged samples,
the clamped ratio, GSPO's sequence ratio, the mismatch metrics, the skipped pi_old forward."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_train_micro import _close
from test_train_step import ARCH, FWD, PROMPT_END, L, _layout

from compiler.vocab import LossAggregation, RatioLevel, RolloutCorrection
from locojax.model import Qwen3, split_params
from locojax.runtime.steps import train_fields
from locojax.train.batch import TrainBatch
from locojax.train.loss import grpo_loss, loss_weights
from locojax.train.optimizer import init_opt_state, make_optimizer
from locojax.train.settings import GrpoSettings, OptimizerSettings
from locojax.train.step import grpo_loss_fn, make_logprob_fn, make_rescore_fn, make_train_step

T = L - PROMPT_END
TOKEN_MEAN = LossAggregation.token_mean


@pytest.fixture(scope="module")
def versions():
    """(graphdef, v0, v1, theta): the sampler's weights, the trainer's one version on, and
    the weights of a later mini-batch of the same batch (so the clip can bind)."""
    graphdef, v0 = split_params(Qwen3(ARCH, rngs=nnx.Rngs(0)))

    def moved(params, seed, scale):
        leaves, tree = jax.tree.flatten(params)
        keys = jax.random.split(jax.random.key(seed), len(leaves))
        return jax.tree.unflatten(tree, [x + scale * jnp.std(x) * jax.random.normal(k, x.shape)
                                         for x, k in zip(leaves, keys, strict=True)])

    v1 = moved(v0, 1, 0.3)
    return graphdef, v0, v1, moved(v1, 2, 0.15)


def _lagged_batch(graphdef, sampler, seed=0):
    """Rows sampled (scored) by `sampler`: its log-probs are the behaviour ones."""
    tokens, positions, valid, response = _layout(seed)
    behaviour = make_logprob_fn(graphdef, forward=FWD)(sampler, tokens, positions, valid)
    adv = jnp.asarray(np.random.default_rng(seed + 1).normal(size=tokens.shape[0]), jnp.float32)
    return TrainBatch(tokens, positions, valid, response, adv, behaviour)


def _plain_logp(graphdef, params, batch):
    """log p(token l | tokens < l) BxT of the response columns: full log-softmax, no chunks."""
    model = nnx.merge(graphdef, params)
    hidden, _ = model(batch.tokens_BxL, batch.positions_BxL, kv_valid_BxS=batch.valid_BxL)
    logp_all = jax.nn.log_softmax(model.logits(hidden)[:, :-1], axis=-1)
    logp = jnp.take_along_axis(logp_all, batch.tokens_BxL[:, 1:, None], -1)[..., 0]
    return logp[:, -T:]


def test_decoupled_objective_at_lag_one(versions):
    """DA at lag 1: rows from v0, pi_old recomputed by the trainer at v1, gradient at theta
    equals jax.grad of -mean(min(pi_prox / pi_behav, cap) min(r A, clip(r) A)), r = pi / pi_prox."""
    graphdef, v0, v1, theta = versions
    settings = GrpoSettings(clip_eps=0.2, clip_eps_high=0.28, rollout_correction_cap=1.5, aggregation=TOKEN_MEAN,
                            optimizer_steps_per_batch=2, forward=FWD)
    batch = make_rescore_fn(graphdef, settings, recompute_old=True, with_reference=False)(
        v1, None, _lagged_batch(graphdef, v0))
    mask = batch.loss_mask_BxL[:, -T:]
    weights = loss_weights(mask, TOKEN_MEAN)
    grads, metrics = jax.grad(grpo_loss_fn(graphdef, settings), has_aux=True)(
        theta, batch, weights)

    behav = _plain_logp(graphdef, v0, batch)
    prox = _plain_logp(graphdef, v1, batch)
    a = batch.advantages_B[:, None]

    def objective(params):
        r = jnp.exp(_plain_logp(graphdef, params, batch) - prox)
        w = jnp.minimum(jnp.exp(prox - behav), 1.5)
        surrogate = jnp.minimum(r * a, jnp.clip(r, 0.8, 1.28) * a)
        return -jnp.sum(jnp.where(mask, w * surrogate, 0.0)) / mask.sum()

    _close(grads, jax.grad(objective)(theta), rtol=1e-4, atol=1e-6)
    w = np.exp(np.asarray(prox - behav))[np.asarray(mask)]
    assert w.min() < 0.9 and (w > 1.5).any()  # the lag is real and the cap binds
    assert float(metrics["clip_frac"]) > 0.0  # r != 1 at theta
    # Without the behaviour weight (the uncorrected objective) the gradient differs.
    off = jax.grad(grpo_loss_fn(graphdef, dataclasses.replace(settings, rollout_correction=RolloutCorrection.none)),
                   has_aux=True)(theta, batch, weights)[0]
    diff = max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(off),
                                                           jax.tree.leaves(grads), strict=True))
    assert diff > 1e-3


@pytest.mark.parametrize("dual_clip", [0.0, 3.0])
@pytest.mark.parametrize("adv", [-1.0, 1.0])
def test_ratio_clamped_at_extreme_log_ratios(dual_clip, adv):
    behaviour = jnp.zeros((1, 4))
    logp = jnp.array([[100.0, -100.0, 0.5, 0.0]])
    mask = jnp.array([[True, True, True, False]])
    s = GrpoSettings(dual_clip=dual_clip, aggregation=TOKEN_MEAN, rollout_correction=RolloutCorrection.none)

    def loss(lp):
        return grpo_loss(lp, mask, jnp.asarray([adv]), behaviour, s)[0]

    value, grad = jax.value_and_grad(loss)(logp)
    assert np.isfinite(float(value)) and np.isfinite(np.asarray(grad)).all(), (value, grad)
    r = np.exp(np.array([20.0, -20.0, 0.5]))  # log-ratios clamped to [-20, 20]
    surrogate = np.minimum(r * adv, np.clip(r, 0.8, 1.2) * adv)
    if dual_clip:
        surrogate = np.where(adv < 0, np.maximum(surrogate, dual_clip * adv), surrogate)
    np.testing.assert_allclose(float(value), -surrogate.mean(), rtol=1e-6)
    # Past the clamp the log-ratio has no gradient; inside it the token keeps its own.
    assert float(grad[0, 0]) == 0.0 and float(grad[0, 1]) == 0.0
    expected = 0.0 if adv > 0 else -adv * r[2] / 3  # ratio 1.65 clipped for A > 0
    np.testing.assert_allclose(float(grad[0, 2]), expected, rtol=1e-6)


def _gspo_case(seed=0):
    rng = np.random.default_rng(seed)
    mask = np.zeros((4, 6), bool)
    for b, n in enumerate([6, 3, 1, 4]):
        mask[b, :n] = True
    old = rng.normal(-2.0, 0.5, mask.shape).astype(np.float32)
    logp = (old + rng.normal(0.0, 0.15, mask.shape)).astype(np.float32)
    adv = jnp.asarray([1.0, -1.0, 0.5, -2.0])
    return jnp.asarray(logp), jnp.asarray(mask), adv, jnp.asarray(old)


def test_gspo_sequence_ratio_against_hand_formula():
    logp, mask, adv, old = _gspo_case()
    s = GrpoSettings(ratio_level=RatioLevel.sequence, clip_eps=0.05, clip_eps_high=0.06,
                     aggregation=LossAggregation.sequence_mean, rollout_correction=RolloutCorrection.none)

    def gspo(lp):  # GSPO (Zheng et al. 2025, eq. 7): one ratio per sequence
        n = mask.sum(1)
        s_B = jnp.exp(jnp.where(mask, lp - old, 0.0).sum(1) / n)
        return -jnp.mean(jnp.minimum(s_B * adv, jnp.clip(s_B, 0.95, 1.06) * adv)), s_B

    (loss, metrics), grad = jax.value_and_grad(
        lambda lp: grpo_loss(lp, mask, adv, old, s), has_aux=True)(logp)
    (want, s_B), want_grad = jax.value_and_grad(gspo, has_aux=True)(logp)
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-5, atol=1e-8)
    m = np.asarray(mask)
    s_np = np.asarray(s_B)
    np.testing.assert_allclose(float(metrics["ratio_mean"]),
                               (np.broadcast_to(s_np[:, None], m.shape))[m].mean(), rtol=1e-6)
    clipped = (s_np > 1.06) & (np.asarray(adv) > 0) | (s_np < 0.95) & (np.asarray(adv) < 0)
    assert 0 < clipped.sum() < 4, s_np  # the case has both clipped and live sequences
    # The token ratio is another objective: the test has teeth.
    token = dataclasses.replace(s, ratio_level=RatioLevel.token)
    assert abs(float(grpo_loss(logp, mask, adv, old, token)[0]) - float(want)) > 1e-4


def test_mismatch_and_weight_metrics():
    logp, mask, adv, old = _gspo_case(seed=3)
    rollout = old + jnp.asarray(np.random.default_rng(4).normal(0, 0.6, old.shape), jnp.float32)
    m = np.asarray(mask)
    gap = np.abs(np.asarray(old - rollout))[m]
    w = np.exp(np.asarray(old - rollout))[m]
    s = GrpoSettings(rollout_correction_cap=1.5, aggregation=TOKEN_MEAN)
    _, metrics = grpo_loss(logp, mask, adv, old, s, rollout_logp_BxL=rollout)
    np.testing.assert_allclose(float(metrics["logp_mismatch_mean"]), gap.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["logp_mismatch_max"]), gap.max(), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["rc_weight_mean"]), np.minimum(w, 1.5).mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["rc_clip_frac"]), (w > 1.5).mean(), rtol=1e-6)
    assert 0 < (w > 1.5).mean() < 1
    # Correction off: the mismatch is still measured; no weight metrics.
    _, off = grpo_loss(logp, mask, adv, old, dataclasses.replace(s, rollout_correction=RolloutCorrection.none),
                       rollout_logp_BxL=rollout)
    assert float(off["logp_mismatch_max"]) == pytest.approx(gap.max())
    assert "rc_weight_mean" not in off
    # No sampler log-probs beside pi_old: nothing measured, so no mismatch is reported.
    _, same = grpo_loss(logp, mask, adv, old, s)
    assert not {"logp_mismatch_mean", "logp_mismatch_max"} & same.keys()
    row = train_fields(metrics)  # the step's metrics reach the row whole
    assert {"logp_mismatch_mean", "logp_mismatch_max", "rc_weight_mean", "rc_clip_frac"} <= row.keys()


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_skipped_old_forward_gives_the_recomputed_update(versions, micro_batches):
    """One update per batch: pi_old = stop_gradient(pi) without its forward equals the
    recomputed path's update (lagged rows, behaviour weight on) within fp32 rounding."""
    graphdef, v0, v1, _ = versions
    fwd = dataclasses.replace(FWD, micro_batches=micro_batches)
    settings = GrpoSettings(clip_eps_high=0.28, rollout_correction_cap=1.5, aggregation=TOKEN_MEAN,
                            optimizer_steps_per_batch=1, forward=fwd,
                            optimizer=OptimizerSettings(learning_rate=1e-3))
    skip = dataclasses.replace(settings, old_is_current=True)
    batch = _lagged_batch(graphdef, v0, seed=7)
    rescored = make_rescore_fn(graphdef, settings, recompute_old=True, with_reference=False)(
        v1, None, batch)
    tx = make_optimizer(settings.optimizer)
    out = []
    for s, b in ((settings, rescored), (skip, batch)):
        params = jax.tree.map(jnp.copy, v1)
        params, _, metrics = make_train_step(graphdef, s)(params, init_opt_state(tx, v1), b)
        out.append((params, metrics))
    (recomputed, m_re), (skipped, m_skip) = out
    _close(skipped, recomputed, rtol=1e-5, atol=1e-7)
    moved = max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(skipped),
                                                           jax.tree.leaves(v1), strict=True))
    assert moved > 1e-4  # the update is not trivially equal
    for k in ("loss", "logp_mismatch_mean", "logp_mismatch_max", "rc_weight_mean", "ratio_mean"):
        np.testing.assert_allclose(float(m_skip[k]), float(m_re[k]), rtol=1e-5, atol=1e-7)
    assert float(m_skip["logp_mismatch_mean"]) > 0.05  # lag 1: pi_old is not the sampler
    with pytest.raises(ValueError, match="old_is_current"):
        dataclasses.replace(skip, optimizer_steps_per_batch=2)

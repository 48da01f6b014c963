"""Micro-batched gradient accumulation, remat, response-only scoring and rescoring are exact."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from test_train_step import ARCH, FWD, PROMPT_END, SETTINGS, L, _grpo_batch, _layout

from compiler.vocab import LossAggregation, Remat
from locojax.model import Qwen3, split_params
from locojax.train.batch import SftBatch
from locojax.train.loss import grpo_loss, loss_weights
from locojax.train.optimizer import init_opt_state, make_optimizer
from locojax.train.step import (
    accumulate_grads,
    make_logprob_fn,
    make_rescore_fn,
    make_sft_step,
    make_train_step,
    score_tokens,
    split_minibatches,
)

AGGREGATIONS = list(LossAggregation)


@pytest.fixture(scope="module")
def model_params():
    return split_params(Qwen3(ARCH, rngs=nnx.Rngs(0)))


def _settings(aggregation, micro_batches, **forward):
    fwd = dataclasses.replace(FWD, micro_batches=micro_batches, **forward)
    return dataclasses.replace(SETTINGS, aggregation=aggregation, optimizer_steps_per_batch=1,
                               forward=fwd)


def _grpo_loss_fn(graphdef, settings):
    def loss_fn(params, mb, weights):
        logp, entropy = score_tokens(graphdef, params, mb.tokens_BxL, mb.positions_BxL,
                                     mb.valid_BxL, settings.forward)
        t = logp.shape[1]
        return grpo_loss(logp, mb.loss_mask_BxL[:, -t:], mb.advantages_B,
                         mb.behaviour_logp_BxL[:, -t:], settings,
                         ref_logp_BxL=mb.ref_logp_BxL[:, -t:], entropy_BxL=entropy,
                         weights=weights)

    return loss_fn


def _close(a, b, rtol=2e-5, atol=1e-7):
    """Leaves equal within rounding: rtol, or rtol of the leaf's largest entry (sums of
    cancelling terms in another order)."""
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        y = np.asarray(y)
        scale = float(np.abs(y).max()) if y.size else 0.0
        np.testing.assert_allclose(np.asarray(x), y, rtol=rtol, atol=max(atol, rtol * scale))


def _off_policy_batch(graphdef, params):
    """Off-policy behaviour (the clip is active) and a reference: every loss term counts."""
    batch = _grpo_batch(graphdef, params, seed=2, ref_noise=0.2)
    noise = 0.3 * jax.random.normal(jax.random.key(9), batch.behaviour_logp_BxL.shape)
    return dataclasses.replace(batch, behaviour_logp_BxL=batch.behaviour_logp_BxL + noise)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_micro_batches_give_the_same_gradient(model_params, aggregation):
    graphdef, params = model_params
    batch = _off_policy_batch(graphdef, params)
    t = L - PROMPT_END
    loss_fn = _grpo_loss_fn(graphdef, _settings(aggregation, 1))

    def weights_of(mb):
        return loss_weights(mb.loss_mask_BxL[:, -t:], aggregation, SETTINGS.max_response_len)

    @jax.jit
    def grads(params, batch):
        g1, m1 = accumulate_grads(loss_fn, params, batch, weights_of(batch), 1)
        g4, m4 = accumulate_grads(loss_fn, params, batch, weights_of(batch), 4)
        # Each micro-batch normalised by its own counts: what the whole-batch weights avoid.
        chunks = split_minibatches(batch, 4)
        naive = [jax.grad(lambda p, b: loss_fn(p, b, weights_of(b))[0])(
            params, jax.tree.map(lambda x, i=i: x[i], chunks)) for i in range(4)]
        return g1, m1, g4, m4, jax.tree.map(lambda *g: sum(g), *naive)

    g1, m1, g4, m4, naive = grads(params, batch)
    _close(g1, g4)
    for k in m1:
        np.testing.assert_allclose(m1[k], m4[k], rtol=2e-5, atol=1e-7, err_msg=k)
    assert 0 < float(m1["clip_frac"]) < 1
    # The test has teeth: per-micro-batch normalisers (token or sequence counts of a quarter
    # of the rows) give another gradient.
    leaf1, leaf_naive = jax.tree.leaves(g1)[0], jax.tree.leaves(naive)[0]
    assert not np.allclose(leaf1, leaf_naive, rtol=1e-2)


def test_micro_batched_step_gives_the_same_update(model_params):
    graphdef, params = model_params
    batch = _off_policy_batch(graphdef, params)
    # Adam divides by |g| + eps: with the default eps an entry whose gradient is ~1e-8
    # (rounding noise) moves by an arbitrary part of lr, so a larger eps keeps the update a
    # smooth function of the gradient.
    one, four = _settings(LossAggregation.sequence_mean, 1), _settings(LossAggregation.sequence_mean, 4)
    opt = dataclasses.replace(one.optimizer, eps=0.1)
    one, four = (dataclasses.replace(s, optimizer=opt) for s in (one, four))
    tx = make_optimizer(opt)
    p1, _, s1 = make_train_step(graphdef, one, donate=False)(params, init_opt_state(tx, params),
                                                             batch)
    p4, _, s4 = make_train_step(graphdef, four, donate=False)(params, init_opt_state(tx, params),
                                                              batch)
    moved = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(), p1, params)
    assert max(jax.tree.leaves(moved)) > 1e-4  # the update is not trivially small
    _close(p1, p4, atol=2e-7)
    for k in ("grad_norm", "loss", "clip_frac", "kl"):
        np.testing.assert_allclose(s1[k], s4[k], rtol=2e-5, atol=1e-7, err_msg=k)


def test_sft_micro_batches_give_the_same_update(model_params):
    graphdef, params = model_params
    batch = SftBatch(*_layout(5))
    opt = dataclasses.replace(SETTINGS.optimizer, eps=0.1)  # see the test above
    tx = make_optimizer(opt)
    out = [make_sft_step(graphdef, opt, forward=dataclasses.replace(FWD, micro_batches=m),
                         donate=False)(params, init_opt_state(tx, params), batch)
           for m in (1, 4)]
    _close(out[0][0], out[1][0], atol=2e-7)
    np.testing.assert_allclose(out[0][2]["loss"], out[1][2]["loss"], rtol=2e-5)


def test_remat_keeps_gradients(model_params):
    graphdef, params = model_params
    batch = _grpo_batch(graphdef, params, seed=4, ref_noise=0.1)
    grads = []
    for remat in Remat:
        settings = _settings(LossAggregation.token_mean, 1, remat=remat)
        t = L - PROMPT_END
        weights = loss_weights(batch.loss_mask_BxL[:, -t:], LossAggregation.token_mean)
        loss_fn = _grpo_loss_fn(graphdef, settings)
        grads.append(jax.jit(lambda p, b, w, f=loss_fn: accumulate_grads(f, p, b, w, 1)[0])(
            params, batch, weights))
    _close(grads[0], grads[1], rtol=1e-5)


def test_response_columns_equal_the_full_forward(model_params):
    graphdef, params = model_params
    tokens, positions, valid, _ = _layout(1)
    t = L - PROMPT_END
    full = score_tokens(graphdef, params, tokens, positions, valid,
                        dataclasses.replace(FWD, response_len=0))
    cols = score_tokens(graphdef, params, tokens, positions, valid, FWD)
    assert full[0].shape == (tokens.shape[0], L - 1) and cols[0].shape == (tokens.shape[0], t)
    _close(full[0][:, -t:], cols[0], rtol=1e-5, atol=1e-5)
    _close(full[1][:, -t:], cols[1], rtol=1e-5, atol=1e-5)
    # BxL form: zero on the prompt columns, the scored columns in place.
    logp = make_logprob_fn(graphdef, forward=FWD, chunks=4)(params, tokens, positions, valid)
    np.testing.assert_array_equal(logp[:, :PROMPT_END], 0.0)
    np.testing.assert_allclose(logp[:, PROMPT_END:], cols[0], rtol=1e-5, atol=1e-5)


def test_rescore_recomputes_old_and_reference(model_params):
    graphdef, params = model_params
    batch = _grpo_batch(graphdef, params, seed=6)
    engine = batch.behaviour_logp_BxL + 0.01  # stands in for the engine's numerics
    batch = dataclasses.replace(batch, behaviour_logp_BxL=engine)
    reference = jax.tree.map(lambda x: x * 1.01, params)
    settings = dataclasses.replace(_settings(LossAggregation.token_mean, 2),
                                   optimizer_steps_per_batch=2)
    out = make_rescore_fn(graphdef, settings, recompute_old=True, with_reference=True)(
        params, reference, batch)
    logp_fn = make_logprob_fn(graphdef, forward=FWD)
    args = (batch.tokens_BxL, batch.positions_BxL, batch.valid_BxL)
    np.testing.assert_allclose(out.behaviour_logp_BxL, logp_fn(params, *args), atol=1e-5)
    np.testing.assert_allclose(out.ref_logp_BxL, logp_fn(reference, *args), atol=1e-5)
    np.testing.assert_array_equal(out.rollout_logp_BxL, engine)
    kept = make_rescore_fn(graphdef, settings, recompute_old=False, with_reference=False)(
        params, None, batch)
    np.testing.assert_array_equal(kept.behaviour_logp_BxL, engine)
    assert kept.ref_logp_BxL is None

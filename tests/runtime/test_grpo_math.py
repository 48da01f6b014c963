"""GRPO maths on plain arrays: advantages, chunked log-probs, the loss and its masks."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compiler.vocab import DUAL_CLIP_LOSSES, LossAggregation, PolicyLoss, RolloutCorrection
from locojax.train.advantages import group_advantages
from locojax.train.logprobs import next_token_logprobs, reference_logprobs, token_logprobs
from locojax.train.loss import POLICY_LOSSES, aggregation_weights, grpo_loss, k3_kl, sft_loss
from locojax.train.settings import GrpoSettings

AGGREGATIONS = list(LossAggregation)


# ---------------------------------------------------------------- advantages


@pytest.mark.parametrize("normalize_std", [True, False])
def test_advantages_sum_to_zero_per_group(normalize_std):
    rewards = jax.random.uniform(jax.random.key(0), (6, 8))
    adv = group_advantages(rewards, normalize_std=normalize_std)
    np.testing.assert_allclose(adv.sum(axis=1), 0.0, atol=1e-5)
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    if normalize_std:
        np.testing.assert_allclose(adv.std(axis=1, ddof=1), 1.0, rtol=1e-3)  # TRL, verl
    else:
        np.testing.assert_allclose(adv, centred, atol=1e-6)


def test_advantages_zero_when_group_rewards_equal():
    rewards = jnp.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    adv = group_advantages(rewards)
    np.testing.assert_array_equal(adv[:2], 0.0)
    # sample std (ddof 1) of [0, 1, 0, 1] is sqrt(1/3): advantages +-0.5 / sqrt(1/3)
    np.testing.assert_allclose(adv[2], np.array([-1.0, 1.0, -1.0, 1.0]) * np.sqrt(0.75),
                               atol=1e-5)
    np.testing.assert_array_equal(group_advantages(np.array([[3.0], [1.0]])), 0.0)


# ---------------------------------------------------------------- log-probs


def _hidden_and_unembed(n=37, d=16, v=1000, seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    h = jax.random.normal(k[0], (n, d))
    w = jax.random.normal(k[1], (d, v)) * 0.7
    t = jax.random.randint(k[2], (n,), 0, v)
    return h, w, t


MODES = {"chunk128": dict(vocab_chunk=128), "chunk300": dict(vocab_chunk=300),
         "chunk1000": dict(vocab_chunk=1000), "chunk4096": dict(vocab_chunk=4096),
         "kept": dict(keep_probs=True), "kept_t07": dict(keep_probs=True, temperature=0.7),
         "chunk128_t07": dict(vocab_chunk=128, temperature=0.7)}


def _reference(h, w, t, temperature=1.0, **_):
    return reference_logprobs(h / temperature, w, t)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_chunked_logprobs_equal_log_softmax(mode):
    h, w, t = _hidden_and_unembed()
    logp, entropy = jax.jit(lambda h, w: token_logprobs(h, w, t, **MODES[mode]))(h, w)
    ref_logp, ref_entropy = _reference(h, w, t, **MODES[mode])
    np.testing.assert_allclose(logp, ref_logp, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(entropy, ref_entropy, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["chunk128", "chunk300", "kept", "kept_t07", "chunk128_t07"])
def test_chunked_logprob_gradients_equal_log_softmax(mode):
    h, w, t = _hidden_and_unembed()
    ct = jax.random.normal(jax.random.key(9), t.shape)

    def chunked(h, w):
        return (token_logprobs(h, w, t, **MODES[mode])[0] * ct).sum()

    def plain(h, w):
        return (_reference(h, w, t, **MODES[mode])[0] * ct).sum()

    got = jax.jit(jax.grad(chunked, (0, 1)))(h, w)
    want = jax.grad(plain, (0, 1))(h, w)
    chex.assert_trees_all_close(got, want, atol=2e-5, rtol=1e-5)
    # Entropy is a metric: it carries no gradient.
    entropy_grad = jax.grad(lambda h: token_logprobs(h, w, t, **MODES[mode])[1].sum())(h)
    np.testing.assert_array_equal(entropy_grad, 0.0)


def test_next_token_logprobs_align_to_tokens():
    k = jax.random.split(jax.random.key(1), 3)
    hidden = jax.random.normal(k[0], (2, 5, 8))
    w = jax.random.normal(k[1], (8, 50))
    tokens = jax.random.randint(k[2], (2, 5), 0, 50)
    logp, _ = np.asarray(next_token_logprobs(hidden, w, tokens, vocab_chunk=16))
    full = np.asarray(jax.nn.log_softmax(hidden @ w, axis=-1))
    tokens = np.asarray(tokens)
    np.testing.assert_array_equal(logp[:, 0], 0.0)
    for b in range(2):
        for pos in range(1, 5):
            np.testing.assert_allclose(logp[b, pos], full[b, pos - 1, tokens[b, pos]], atol=1e-5)


# ---------------------------------------------------------------- loss


def _loss_case(seed=0, b=4, length=7):
    """Random log-probs with a few ragged response masks (one row empty = batch padding)."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((b, length), bool)
    mask[0, 2:7] = True
    mask[1, 3:5] = True
    mask[2, 1:7] = True  # row 3 has no response tokens
    logp = rng.normal(-2.0, 0.5, (b, length)).astype(np.float32)
    behaviour = (logp + rng.normal(0.0, 0.5, (b, length))).astype(np.float32)
    ref = (logp + rng.normal(0.0, 0.3, (b, length))).astype(np.float32)
    adv = rng.normal(0.0, 1.0, b).astype(np.float32)
    return logp, mask, adv, behaviour, ref


def _numpy_grpo_loss(logp, mask, adv, behaviour, ref, s: GrpoSettings) -> float:
    """Direct loop implementation of the GRPO objective."""
    per_seq, all_tokens, sequences = [], [], 0
    for b in range(logp.shape[0]):
        terms = []
        for pos in range(logp.shape[1]):
            if not mask[b, pos]:
                continue
            ratio = np.exp(float(logp[b, pos]) - float(behaviour[b, pos]))
            clipped = min(max(ratio, 1 - s.clip_eps), 1 + s.clip_eps_high)
            term = -min(ratio * adv[b], clipped * adv[b])
            if s.kl_coef:
                d = float(ref[b, pos]) - float(logp[b, pos])
                term += s.kl_coef * (np.exp(d) - d - 1)
            terms.append(term)
        if terms:
            sequences += 1
            per_seq.append(sum(terms) / len(terms))
            all_tokens += terms
    if s.aggregation == LossAggregation.sequence_mean:
        return sum(per_seq) / sequences
    if s.aggregation == LossAggregation.token_mean:
        return sum(all_tokens) / len(all_tokens)
    return sum(all_tokens) / (s.max_response_len * sequences)


@pytest.mark.parametrize("kl_coef", [0.0, 0.1], ids=["no_kl", "kl"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_loss_equals_numpy_reference(aggregation, kl_coef):
    logp, mask, adv, behaviour, ref = _loss_case()
    s = GrpoSettings(
        clip_eps=0.2, clip_eps_high=0.28, kl_coef=kl_coef, aggregation=aggregation,
        max_response_len=8,
    )  # fmt: skip
    loss, metrics = jax.jit(lambda *a: grpo_loss(*a, s, ref_logp_BxL=ref))(
        logp, mask, adv, behaviour
    )
    want = _numpy_grpo_loss(logp, mask, adv, behaviour, ref, s)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["loss"], want, rtol=1e-5, atol=1e-6)
    ratio = np.exp(logp - behaviour)[mask]
    np.testing.assert_allclose(metrics["ratio_mean"], ratio.mean(), rtol=1e-5)
    d = (ref - logp)[mask]
    np.testing.assert_allclose(metrics["kl"], (np.exp(d) - d - 1).mean(), rtol=1e-5)
    a = np.broadcast_to(adv[:, None], mask.shape)[mask]
    clipped = ((a > 0) & (ratio > 1.28)) | ((a < 0) & (ratio < 0.8))
    np.testing.assert_allclose(metrics["clip_frac"], clipped.mean(), rtol=1e-6)
    assert 0 < float(metrics["clip_frac"]) < 1  # the case exercises both branches


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_on_policy_loss_is_minus_weighted_mean_advantage(aggregation):
    logp, mask, adv, _, _ = _loss_case(seed=3)
    s = GrpoSettings(aggregation=aggregation, max_response_len=8)
    loss, metrics = grpo_loss(logp, mask, adv, logp, s)
    np.testing.assert_allclose(metrics["ratio_mean"], 1.0, rtol=1e-6)
    assert float(metrics["clip_frac"]) == 0.0
    lengths = mask.sum(1)
    has = lengths > 0
    if aggregation == LossAggregation.token_mean:
        want = -(adv * lengths).sum() / lengths.sum()
    elif aggregation == LossAggregation.sequence_mean:
        want = -adv[has].mean()
    else:
        want = -(adv * lengths).sum() / (8 * has.sum())
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    # On-policy, d loss / d logp = -A * weight: the policy-gradient estimator.
    grad = jax.grad(lambda lp: grpo_loss(lp, mask, adv, logp, s)[0])(logp)
    weights = aggregation_weights(jnp.asarray(mask), aggregation, 8)
    np.testing.assert_allclose(grad, -adv[:, None] * weights, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_no_gradient_at_prompt_and_padding(aggregation):
    k = jax.random.split(jax.random.key(4), 4)
    b, length, d, v = 4, 7, 8, 40
    # Moderate logits: log-probs near the clamp-free range of the k3 term (|ref - logp| < 20).
    hidden = 0.3 * jax.random.normal(k[0], (b, length, d))
    w = jax.random.normal(k[1], (d, v))
    tokens = jax.random.randint(k[2], (b, length), 0, v)
    _, mask, adv, _, _ = _loss_case(b=b, length=length)
    # Off-mask behaviour/reference values are garbage on purpose: they must not leak (no NaN).
    behaviour = jnp.where(mask, -3.0, -jnp.inf)
    ref = jnp.where(mask, -2.5, jnp.inf)
    s = GrpoSettings(aggregation=aggregation, kl_coef=0.05, max_response_len=8)

    def loss(hidden):
        logp, entropy = next_token_logprobs(hidden, w, tokens, vocab_chunk=16)
        return grpo_loss(logp, mask, adv, behaviour, s, ref_logp_BxL=ref, entropy_BxL=entropy)

    (value, metrics), grad = jax.jit(jax.value_and_grad(loss, has_aux=True))(hidden)
    assert np.isfinite(value) and all(np.isfinite(m) for m in metrics.values())
    # hidden[:, l] predicts token l + 1: it has gradient iff token l + 1 is a response token.
    predicts_response = np.zeros((b, length), bool)
    predicts_response[:, :-1] = mask[:, 1:]
    norms = np.abs(np.asarray(grad)).sum(-1)
    np.testing.assert_array_equal(norms[~predicts_response], 0.0)
    assert (norms[predicts_response] > 0).all()


def test_kl_needs_reference():
    logp, mask, adv, behaviour, _ = _loss_case()
    with pytest.raises(ValueError, match="kl_coef"):
        grpo_loss(logp, mask, adv, behaviour, GrpoSettings(kl_coef=0.1))


def test_sft_loss_is_masked_token_mean_cross_entropy():
    logp, mask, _, _, _ = _loss_case()
    logp = np.where(mask, logp, -np.inf)  # off-mask values must not matter
    loss, metrics = sft_loss(jnp.asarray(logp), jnp.asarray(mask))
    np.testing.assert_allclose(loss, -logp[mask].mean(), rtol=1e-6)
    assert float(metrics["response_tokens"]) == mask.sum()


def test_k3_kl_is_clamped_with_no_gradient_beyond_the_bounds():
    mask = np.ones((1, 5), bool)
    logp = jnp.asarray([[-1.0, -3.0, -4.0, -40.0, -200.0]])  # d = 0, 2, 3, 39, 199
    ref = jnp.full((1, 5), -1.0)
    kl = k3_kl(logp, ref, mask)
    d = np.asarray(ref - logp)
    want = np.minimum(np.exp(np.minimum(d, 20.0)) - np.minimum(d, 20.0) - 1.0, 10.0)
    np.testing.assert_allclose(kl, want, rtol=1e-6)
    assert float(kl.max()) == 10.0 and np.all(np.isfinite(kl))
    grad = jax.grad(lambda lp: k3_kl(lp, ref, mask).sum())(logp)
    assert np.all(np.isfinite(grad))
    assert float(grad[0, 1]) != 0.0  # d = 2: k3 = e^2 - 3 < 10, unclamped
    np.testing.assert_array_equal(grad[0, 2:], 0.0)  # clamped at 10: no gradient


def test_dual_clip_bounds_negative_advantage_surrogate():
    logp = jnp.log(jnp.asarray([[1.0, 2.0, 5.0, 5.0]]))  # ratios 1, 2, 5, 5 (behaviour 0)
    mask = np.ones((1, 4), bool)
    behaviour = jnp.zeros((1, 4))
    for adv, c in ((-1.0, 3.0), (1.0, 3.0)):
        s = GrpoSettings(dual_clip=c, aggregation=LossAggregation.token_mean)
        loss, metrics = grpo_loss(logp, mask, jnp.asarray([adv]), behaviour, s)
        ratio = np.array([1.0, 2.0, 5.0, 5.0])
        surrogate = np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.2) * adv)
        if adv < 0:
            surrogate = np.maximum(surrogate, c * adv)  # -5 -> -3 on the two ratio-5 tokens
        np.testing.assert_allclose(loss, -surrogate.mean(), rtol=1e-6)
        np.testing.assert_allclose(metrics["dual_clip_frac"], 0.5 if adv < 0 else 0.0)
        grad = jax.grad(lambda lp, a=adv, s=s: grpo_loss(lp, mask, jnp.asarray([a]),
                                                         behaviour, s)[0])(logp)
        if adv < 0:  # the floored tokens get no gradient; ratio 2 keeps its -A r / n
            np.testing.assert_allclose(grad[0], [0.25, 0.5, 0.0, 0.0], rtol=1e-6)
    with pytest.raises(ValueError, match="dual_clip"):
        GrpoSettings(dual_clip=0.5)


def test_every_policy_loss_has_its_function():
    assert set(POLICY_LOSSES) == set(PolicyLoss)
    assert DUAL_CLIP_LOSSES <= set(PolicyLoss)
    with pytest.raises(ValueError, match="the cispo loss has none"):
        GrpoSettings(loss=PolicyLoss.cispo, dual_clip=3.0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_cispo_keeps_the_clipped_tokens_gradient_at_the_clipped_weight(aggregation):
    """CISPO (arXiv:2506.13585 eq. 4) against its formula: loss = -sum_t w_t clip(r_t) A,
    d loss / d log pi_t = -w_t clip(r_t) A on every response token (w the aggregation's
    weight), where PPO's clip gives the clipped tokens none."""
    logp, mask, adv, behaviour, _ = _loss_case(seed=7)
    s = GrpoSettings(loss=PolicyLoss.cispo, clip_eps=0.2, clip_eps_high=0.28,
                     aggregation=aggregation, max_response_len=8)
    w = np.asarray(aggregation_weights(jnp.asarray(mask), aggregation, 8))
    ratio = np.exp(logp - behaviour)
    weight = np.clip(ratio, 0.8, 1.28)
    a = adv[:, None]
    loss, metrics = grpo_loss(logp, mask, adv, behaviour, s)
    np.testing.assert_allclose(loss, -(w * weight * a)[mask].sum(), rtol=1e-5, atol=1e-7)
    clipped = (ratio > 1.28) | (ratio < 0.8)
    np.testing.assert_allclose(metrics["clip_frac"], clipped[mask].mean(), rtol=1e-6)
    assert 0 < float(metrics["clip_frac"]) < 1  # both kinds of token in the case

    def grad(settings):
        return np.asarray(jax.grad(lambda lp: grpo_loss(lp, mask, adv, behaviour, settings)[0])(
            jnp.asarray(logp)))

    g = grad(s)
    np.testing.assert_allclose(g, np.where(mask, -w * weight * a, 0.0), rtol=1e-5, atol=1e-7)
    ppo = grad(GrpoSettings(clip_eps=0.2, clip_eps_high=0.28, aggregation=aggregation,
                            max_response_len=8))
    binds = mask & (((a > 0) & (ratio > 1.28)) | ((a < 0) & (ratio < 0.8)))
    assert binds.any() and np.all(ppo[binds] == 0) and np.all(g[binds] != 0)
    # inside the clip range both are the same policy gradient, r A grad log pi
    free = mask & (ratio > 0.8) & (ratio < 1.28)
    np.testing.assert_allclose(g[free], ppo[free], rtol=1e-5)


def test_truncated_importance_weight():
    logp, mask, adv, behaviour, _ = _loss_case(seed=5)
    rollout = behaviour + np.random.default_rng(0).normal(0.0, 0.5, behaviour.shape)
    s = GrpoSettings(rollout_correction_cap=2.0, aggregation=LossAggregation.token_mean)
    loss, metrics = grpo_loss(logp, mask, adv, behaviour, s, rollout_logp_BxL=rollout)
    weight = np.minimum(np.exp(behaviour - rollout), 2.0)
    ratio = np.exp(logp - behaviour)
    a = adv[:, None]
    surrogate = np.minimum(ratio * a, np.clip(ratio, 0.8, 1.2) * a)
    np.testing.assert_allclose(loss, -(weight * surrogate)[mask].mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["rc_weight_mean"], weight[mask].mean(), rtol=1e-5)
    assert 1.0 < weight[mask].max() <= 2.0 and weight[mask].min() < 1.0
    off = GrpoSettings(rollout_correction=RolloutCorrection.none, aggregation=LossAggregation.token_mean)
    unweighted = float(grpo_loss(logp, mask, adv, behaviour, off)[0])
    assert unweighted != pytest.approx(float(loss))
    # without the sampler's own log-probs the behaviour ones are the sampler's: weight 1
    assert float(grpo_loss(logp, mask, adv, behaviour, s)[0]) == pytest.approx(unweighted)

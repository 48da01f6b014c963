"""Mixed precision: fp32 master weights and AdamW moments, bf16 compute, updates not lost."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from locojax.model import ModelArch, Qwen3, compute_copy, split_params
from locojax.train.batch import TrainBatch
from locojax.train.loss import grpo_loss, loss_weights
from locojax.train.optimizer import init_opt_state, make_optimizer
from locojax.train.settings import ForwardSettings, GrpoSettings, OptimizerSettings
from locojax.train.step import accumulate_grads, make_logprob_fn, make_train_step, score_tokens

# The arith_co experiment's model (conf/experiment/arith_co.yaml), bf16 compute.
ARITH = ModelArch(num_layers=2, hidden=128, num_heads=4, num_kv_heads=2, head_dim=32, ffn=384,
                  vocab=32, dtype="bfloat16", param_dtype="float32")
B, W, T = 16, 12, 8


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    length = W + T
    tokens = rng.integers(0, ARITH.vocab, (B, length)).astype(np.int32)
    cols = np.arange(length)
    pad = rng.integers(0, W // 2, B)
    ends = W + rng.integers(2, T + 1, B)
    valid = (cols >= pad[:, None]) & (cols < ends[:, None])
    mask = valid & (cols >= W)
    positions = np.maximum(cols - pad[:, None], 0).astype(np.int32)
    adv = rng.choice([-1.0, 1.0], B).astype(np.float32)
    return tokens, positions, valid, mask, adv


SETTINGS = GrpoSettings(max_response_len=T, forward=ForwardSettings(response_len=T),
                        optimizer=OptimizerSettings(learning_rate=1e-6))


def _changed_fraction(arch):
    graphdef, params = split_params(Qwen3(arch, rngs=nnx.Rngs(0)))
    tokens, positions, valid, mask, adv = _batch()
    logp = make_logprob_fn(graphdef, forward=SETTINGS.forward)(params, tokens, positions, valid)
    batch = TrainBatch(*(jnp.asarray(x) for x in (tokens, positions, valid, mask, adv)), logp)

    def loss_fn(p, mb, w):
        lp, ent = score_tokens(graphdef, p, mb.tokens_BxL, mb.positions_BxL, mb.valid_BxL,
                               SETTINGS.forward)
        return grpo_loss(lp, mb.loss_mask_BxL[:, -T:], mb.advantages_B,
                         mb.behaviour_logp_BxL[:, -T:], SETTINGS, entropy_BxL=ent, weights=w)

    weights = loss_weights(batch.loss_mask_BxL[:, -T:], SETTINGS.aggregation)
    grads, _ = jax.jit(lambda p, b: accumulate_grads(loss_fn, p, b, weights, 1))(params, batch)
    tx = make_optimizer(SETTINGS.optimizer)
    opt_state = init_opt_state(tx, params)
    step = make_train_step(graphdef, SETTINGS, donate=False)
    new, new_opt, _ = step(params, opt_state, batch)
    changed = nonzero = 0
    for g, p0, p1 in zip(*(jax.tree.leaves(x) for x in (grads, params, new)), strict=True):
        live = np.asarray(g) != 0
        changed += int((np.asarray(p0) != np.asarray(p1))[live].sum())
        nonzero += int(live.sum())
    return changed / nonzero, grads, new, new_opt


def test_bf16_compute_step_moves_the_fp32_master():
    fraction, grads, new, opt_state = _changed_fraction(ARITH)
    assert fraction > 0.99, fraction
    # Master weights, their gradients and both AdamW moments are fp32.
    for tree in (grads, new, optax.tree_utils.tree_get(opt_state, "mu"),
                 optax.tree_utils.tree_get(opt_state, "nu")):
        assert {x.dtype for x in jax.tree.leaves(tree)} == {jnp.dtype(jnp.float32)}


def test_pure_bf16_loses_the_update():
    """The comparison has teeth: bf16 master weights keep most of their values."""
    fraction, *_ = _changed_fraction(dataclasses.replace(ARITH, param_dtype="bfloat16"))
    assert fraction < 0.5, fraction


def test_compute_copy_casts_once_and_scores_alike():
    graphdef, params = split_params(Qwen3(ARITH, rngs=nnx.Rngs(1)))
    copy = compute_copy(params, ARITH)
    assert {x.dtype for x in jax.tree.leaves(copy)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    tokens, positions, valid, _, _ = _batch(1)
    logp = make_logprob_fn(graphdef, forward=SETTINGS.forward)
    # The forward casts the master weights as compute_copy does; XLA may keep the fp32
    # values where it upcasts a bf16 matmul (xla_allow_excess_precision), so bf16 rounding
    # apart the two agree.
    np.testing.assert_allclose(logp(params, tokens, positions, valid),
                               logp(copy, tokens, positions, valid), atol=2e-2)


@pytest.mark.parametrize("field", ["dtype", "param_dtype"])
def test_arch_rejects_unknown_dtypes(field):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(ARITH, **{field: "float16"})

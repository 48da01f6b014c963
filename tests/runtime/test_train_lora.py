"""LoRA training: step 0 is the base, a step moves only the adapters, micro-batches agree,
and the merged rollout weights decode the same greedy tokens as the unmerged model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_train_step import ARCH, FWD, SETTINGS, _grpo_batch

from locojax.model import Qwen3, split_params
from locojax.model.lora import LoraSpec, merged, with_adapters
from locojax.model.qwen3 import forward
from locojax.train.lora import init_adapter_state, lora_split
from locojax.train.optimizer import init_opt_state, make_optimizer
from locojax.train.step import make_rescore_fn, make_train_step, policy_logprobs

SPEC = LoraSpec(rank=4, alpha=8.0)


@pytest.fixture(scope="module")
def model_params():
    return split_params(Qwen3(ARCH, rngs=nnx.Rngs(0)))


def _settings(micro_batches, lr=1e-2):
    return dataclasses.replace(
        SETTINGS, kl_coef=0.1, optimizer_steps_per_batch=1,
        forward=dataclasses.replace(FWD, micro_batches=micro_batches),
        optimizer=dataclasses.replace(SETTINGS.optimizer, learning_rate=lr, warmup_steps=0))


def _step(graphdef, base, batch, micro_batches):
    settings = _settings(micro_batches)
    adapters = init_adapter_state(ARCH, SPEC, seed=0)
    opt = init_opt_state(make_optimizer(settings.optimizer), adapters)
    split = lora_split(SPEC)
    rescored = make_rescore_fn(graphdef, settings, recompute_old=True, with_reference=True,
                               split=split)(adapters, base, batch, base)
    step = make_train_step(graphdef, settings, donate=False, split=split)
    new, _, metrics = step(adapters, opt, rescored, base)
    return adapters, new, metrics, rescored


def test_step_zero_is_the_base_exactly(model_params):
    graphdef, base = model_params
    batch = _grpo_batch(graphdef, base, seed=1)
    adapters = init_adapter_state(ARCH, SPEC, seed=0)
    rows = (batch.tokens_BxL, batch.positions_BxL, batch.valid_BxL)
    want = policy_logprobs(graphdef, base, *rows, FWD)[0]
    got = policy_logprobs(graphdef, with_adapters(base, adapters, SPEC), *rows, FWD)[0]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_step_moves_only_the_adapters(model_params):
    graphdef, base = model_params
    before = jax.tree.map(np.asarray, base)
    batch = _grpo_batch(graphdef, base, seed=2)
    old, new, metrics, rescored = _step(graphdef, base, batch, 1)
    # pi_old and the reference are the base's own log-probs at step 0 (B = 0).
    np.testing.assert_array_equal(np.asarray(rescored.ref_logp_BxL),
                                  np.asarray(rescored.behaviour_logp_BxL))
    for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(base), strict=True):
        np.testing.assert_array_equal(x, np.asarray(y))  # the base, bit for bit
    assert metrics["grad_norm"] > 0
    for path, ad in new.items():
        assert not np.array_equal(np.asarray(ad["b"]), np.asarray(old[path]["b"])), path
        assert ad["a"].dtype == ad["b"].dtype == jnp.float32


def test_micro_batches_give_the_same_adapter_update(model_params):
    graphdef, base = model_params
    batch = _grpo_batch(graphdef, base, seed=3)
    old, one, m1, _ = _step(graphdef, base, batch, 1)
    _, four, m4, _ = _step(graphdef, base, batch, 4)
    np.testing.assert_allclose(float(m4["grad_norm"]), float(m1["grad_norm"]), rtol=1e-5)
    # Adam's first update is lr * g / (|g| + eps) per element: a gradient element near eps
    # turns fp32 rounding of the sum into up to ~1e-4 of lr; every other moves by lr alike.
    lr = _settings(1).optimizer.learning_rate
    for x0, x, y in zip(jax.tree.leaves(old), jax.tree.leaves(one), jax.tree.leaves(four),
                        strict=True):
        np.testing.assert_allclose(np.asarray(y) - np.asarray(x0), np.asarray(x) - np.asarray(x0),
                                   rtol=0, atol=1e-3 * lr)


def _greedy(graphdef, params, prompt_BxL, steps):
    tokens = prompt_BxL
    for _ in range(steps):
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        model = nnx.merge(graphdef, params)
        hidden = forward(graphdef, params, tokens, positions)[0]
        nxt = jnp.argmax(model.logits(hidden[:, -1:])[:, 0], axis=-1).astype(tokens.dtype)
        tokens = jnp.concatenate([tokens, nxt[:, None]], axis=1)
    return np.asarray(tokens)


def test_merged_weights_decode_the_unmerged_greedy_tokens(model_params):
    graphdef, base = model_params
    adapters = jax.tree.map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.key(5), x.shape, x.dtype),
        init_adapter_state(ARCH, SPEC, seed=0))
    prompt = jax.random.randint(jax.random.key(6), (4, 5), 1, ARCH.vocab)
    unmerged = _greedy(graphdef, with_adapters(base, adapters, SPEC), prompt, 8)
    plain = merged(base, adapters, SPEC, jnp.float32)
    assert _greedy(graphdef, plain, prompt, 8).tolist() == unmerged.tolist()
    assert _greedy(graphdef, base, prompt, 8).tolist() != unmerged.tolist()  # adapters matter


def test_gemma3_adapters_train_through_its_sliding_layers():
    """LoRA on Gemma 3 (Gemma's module names are the same q/k/v/o/gate/up/down): step 0 is
    the base, a step moves the policy, and the merged weights decode the unmerged tokens."""
    gemma = dataclasses.replace(ARCH, family="gemma3", sliding_window=3, sliding_pattern=2,
                                rope_local_theta=100.0, query_pre_attn_scalar=8.0)
    graphdef, base = split_params(Qwen3(gemma, rngs=nnx.Rngs(1)))
    batch = _grpo_batch(graphdef, base, seed=3)
    rows = (batch.tokens_BxL, batch.positions_BxL, batch.valid_BxL)
    adapters = init_adapter_state(gemma, SPEC, seed=0)
    want = policy_logprobs(graphdef, base, *rows, FWD)[0]
    got = policy_logprobs(graphdef, with_adapters(base, adapters, SPEC), *rows, FWD)[0]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    noisy = jax.tree.map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.key(7), x.shape, x.dtype), adapters)
    moved = policy_logprobs(graphdef, with_adapters(base, noisy, SPEC), *rows, FWD)[0]
    assert not np.allclose(np.asarray(moved), np.asarray(want), atol=1e-3)
    prompt = jax.random.randint(jax.random.key(6), (4, 5), 1, gemma.vocab)
    unmerged = _greedy(graphdef, with_adapters(base, noisy, SPEC), prompt, 4)
    assert _greedy(graphdef, merged(base, noisy, SPEC, jnp.float32), prompt, 4).tolist() == (
        unmerged.tolist())

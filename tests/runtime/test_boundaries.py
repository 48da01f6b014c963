"""Wrong ranks, shapes and dtypes stop at the public entry of model, rollout and train with
chex's message (checked at trace time), not deep inside a matmul or a scan."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from locojax.model import ModelArch, Qwen3, split_params
from locojax.rollout.engine import generate
from locojax.rollout.sampler import SamplingSettings
from locojax.train.loss import grpo_loss, sft_loss
from locojax.train.settings import GrpoSettings
from locojax.train.step import score_tokens

ARCH = ModelArch(num_layers=1, hidden=16, num_heads=2, num_kv_heads=1, head_dim=8, ffn=24,
                 vocab=31, tie_embeddings=True, rope_theta=10_000.0)
B, L = 2, 5


@pytest.fixture(scope="module")
def split():
    return split_params(Qwen3(ARCH, rngs=nnx.Rngs(0)))


def _tokens():
    return jnp.ones((B, L), jnp.int32), jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))


@pytest.mark.parametrize("jit", [False, True])
def test_model_forward_checks_its_inputs(split, jit):
    graphdef, params = split
    tokens, positions = _tokens()
    model = nnx.merge(graphdef, params)
    call = jax.jit(lambda t, p: model(t, p)[0]) if jit else (lambda t, p: model(t, p)[0])
    assert call(tokens, positions).shape == (B, L, ARCH.hidden)
    with pytest.raises(AssertionError, match="assert_rank"):
        call(tokens[0], positions[0])
    with pytest.raises(AssertionError, match="assert_type"):
        call(tokens.astype(jnp.float32), positions)
    with pytest.raises(AssertionError, match="assert_equal_shape"):
        call(tokens, positions[:, :-1])
    with pytest.raises(AssertionError, match="assert_shape"):
        model(tokens, positions, kv_valid_BxS=jnp.ones((B, L + 1), bool))


def test_train_entries_check_their_inputs(split):
    graphdef, params = split
    tokens, positions = _tokens()
    valid = jnp.ones((B, L), bool)
    with pytest.raises(AssertionError, match="assert_equal_shape"):
        score_tokens(graphdef, params, tokens, positions, valid[:, 1:])
    logp, mask = jnp.zeros((B, L)), jnp.ones((B, L), bool)
    settings = GrpoSettings()
    assert np.isfinite(float(grpo_loss(logp, mask, jnp.zeros(B), logp, settings)[0]))
    with pytest.raises(AssertionError, match="assert_shape"):
        grpo_loss(logp, mask, jnp.zeros(B + 1), logp, settings)
    with pytest.raises(AssertionError, match="assert_equal_shape"):
        jax.jit(lambda lp, m: grpo_loss(lp, m, jnp.zeros(B), lp[:, 1:], settings))(logp, mask)
    with pytest.raises(AssertionError, match="assert_type"):
        sft_loss(logp.astype(jnp.int32), mask)


def test_generate_checks_padded_prompts(split):
    settings = SamplingSettings(temperature=0.0, max_new_tokens=2)
    prompts = np.ones((B, 3), np.int32)
    with pytest.raises(AssertionError, match="assert_shape"):
        generate(split, (prompts, np.full(B + 1, 3, np.int32)), settings, jax.random.key(0))
    with pytest.raises(AssertionError, match="assert_type"):
        generate(split, (prompts.astype(np.float32), np.full(B, 3, np.int32)), settings,
                 jax.random.key(0))

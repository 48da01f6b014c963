"""Invariants of the Qwen3 forward pass and KV cache on a random tiny model, jit and eager."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from locojax.model import (
    LayerKVCache,
    ModelArch,
    Qwen3,
    abstract_model,
    init_cache,
    split_params,
)
from locojax.model.layers import rope_cos_sin

ARCH = ModelArch(
    num_layers=3,
    hidden=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    ffn=48,
    vocab=97,
    tie_embeddings=False,
    rope_theta=10_000.0,
)


MAX_LEN = 10  # one cache size for every test, so decode compiles once


@pytest.fixture(scope="module")
def model():
    return Qwen3(ARCH, rngs=nnx.Rngs(0))


def tokens(b, length, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, ARCH.vocab, (b, length)), jnp.int32)


def arange_positions(b, length):
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))


class CausalityTest(chex.TestCase):
    """A token changes no hidden state before it, under jit and without (chex variants)."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_future_tokens_do_not_change_the_past(self):
        graphdef, params = split_params(Qwen3(ARCH, rngs=nnx.Rngs(0)))

        @self.variant
        def hidden(params, t):
            return nnx.merge(graphdef, params)(t, arange_positions(*t.shape))[0]

        t = tokens(2, 10)
        changed = t.at[:, 6].set((t[:, 6] + 1) % ARCH.vocab)
        a, b = hidden(params, t), hidden(params, changed)
        chex.assert_trees_all_equal(a[:, :6], b[:, :6])
        assert not np.allclose(a[:, 6:], b[:, 6:])


def test_prefill_then_decode_equals_full_forward(model):
    t = tokens(2, 9)
    full_BxLxD, none = model(t, arange_positions(2, 9))
    assert none is None
    h, cache = model(t[:, :5], arange_positions(2, 5), cache=init_cache(ARCH, 2, MAX_LEN))
    outs = [h]
    for i in range(5, 9):
        h, cache = model(t[:, i : i + 1], jnp.full((2, 1), i, jnp.int32), cache=cache)
        outs.append(h)
    assert int(cache.end) == 9
    np.testing.assert_allclose(jnp.concatenate(outs, 1), full_BxLxD, atol=1e-5, rtol=1e-5)


def test_given_rope_tables_replace_computing_them(model):
    """`rope=` tables of the positions give the same states; tables of other relative
    positions (RoPE ignores a common shift) do not."""
    t, pos_BxL = tokens(2, 6, seed=5), arange_positions(2, 6)
    want_BxLxD, _ = model(t, pos_BxL)
    tables = rope_cos_sin(pos_BxL, ARCH.head_dim, ARCH.rope_theta)
    got_BxLxD, _ = model(t, None, rope=tables)
    np.testing.assert_allclose(got_BxLxD, want_BxLxD, atol=1e-6, rtol=1e-6)
    with pytest.raises(TypeError, match="positions_BxL"):
        model(t, None)
    spread = rope_cos_sin(2 * pos_BxL, ARCH.head_dim, ARCH.rope_theta)
    assert not np.allclose(model(t, None, rope=spread)[0], want_BxLxD, atol=1e-3)


def test_unstacked_layers_with_per_layer_cache_equal_the_scanned_stack(model):
    """The decode loop's form (per-layer weights and caches, unrolled) is the same model."""
    t = tokens(2, 9, seed=3)
    layers = model.unstack_layers()
    assert len(layers) == ARCH.num_layers
    full_BxLxD, _ = model(t, arange_positions(2, 9), layers=layers)
    stacked = init_cache(ARCH, 2, MAX_LEN)
    h, cache = model(t[:, :5], arange_positions(2, 5), cache=LayerKVCache.from_stacked(stacked),
                     layers=layers)
    outs = [h]
    for i in range(5, 9):
        h, cache = model(t[:, i : i + 1], jnp.full((2, 1), i, jnp.int32), cache=cache,
                         layers=layers)
        outs.append(h)
    assert isinstance(cache, LayerKVCache) and int(cache.end) == 9
    scanned_BxLxD, ref = model(t, arange_positions(2, 9), cache=stacked)
    np.testing.assert_allclose(full_BxLxD, scanned_BxLxD, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(jnp.concatenate(outs, 1), scanned_BxLxD, atol=1e-5, rtol=1e-5)
    for i in range(ARCH.num_layers):  # the per-layer caches hold what the stacked one holds
        np.testing.assert_allclose(cache.k_BxKxhdxS[i][..., :9].transpose(0, 1, 3, 2),
                                   ref.k_NxBxKxSxhd[i, :, :, :9],
                                   atol=1e-5, rtol=1e-5)
    with pytest.raises(TypeError, match="LayerKVCache"):
        model(t[:, :5], arange_positions(2, 5), cache=stacked, layers=layers)


def test_left_padded_ragged_batch_equals_each_sequence_alone(model):
    lens, width, new = np.array([4, 7]), 7, 3
    seqs_BxT = tokens(2, width + new, seed=1)  # sequence b is seqs_BxT[b, : lens[b] + new]
    pad_B = width - lens
    prompts_BxP = jnp.asarray(
        np.stack(
            [
                np.pad(np.asarray(s)[:n], (p, 0))
                for s, n, p in zip(seqs_BxT, lens, pad_B, strict=True)
            ]
        )
    )
    positions_BxP = jnp.asarray(np.maximum(np.arange(width)[None] - pad_B[:, None], 0))
    # Unwritten slots are hidden by the causal mask, so they may be marked valid already.
    kv_valid_BxS = jnp.asarray(np.arange(MAX_LEN)[None] >= pad_B[:, None])

    no_cache, _ = model(prompts_BxP, positions_BxP, kv_valid_BxS=kv_valid_BxS[:, :width])
    h, cache = model(
        prompts_BxP, positions_BxP, cache=init_cache(ARCH, 2, MAX_LEN), kv_valid_BxS=kv_valid_BxS
    )
    steps = []
    for i in range(new):
        step_Bx1 = jnp.asarray(np.asarray(seqs_BxT)[np.arange(2), lens + i][:, None])
        pos_Bx1 = jnp.asarray(lens[:, None] + i, jnp.int32)
        hs, cache = model(step_Bx1, pos_Bx1, cache=cache, kv_valid_BxS=kv_valid_BxS)
        steps.append(hs)
    decoded = jnp.concatenate(steps, 1)
    # Each sequence alone, unpadded at the left (what follows it cannot leak: causal).
    alone, _ = model(seqs_BxT, arange_positions(2, width + new))
    for b, n in enumerate(lens):
        np.testing.assert_allclose(no_cache[b, width - n :], alone[b, :n], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(h[b, width - n :], alone[b, :n], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(decoded[b], alone[b, n : n + new], atol=1e-5, rtol=1e-5)
    assert np.isfinite(np.asarray(h)).all(), "padding rows must stay finite"


def test_decode_inside_while_loop_matches_python_loop(model):
    g, params = split_params(model)
    prompt = tokens(2, 4)

    def prefill(params, prompt, cache):
        m = nnx.merge(g, params)
        h, cache = m(prompt, arange_positions(2, 4), cache=cache)
        return jnp.argmax(m.logits(h[:, -1:])[:, 0], -1).astype(jnp.int32), cache

    def step(params, tok_B, cache):
        m = nnx.merge(g, params)
        h, cache = m(tok_B[:, None], jnp.broadcast_to(cache.end, (2, 1)), cache=cache)
        return jnp.argmax(m.logits(h)[:, 0], -1).astype(jnp.int32), cache

    @jax.jit
    def generate(params, prompt):
        tok, cache = prefill(params, prompt, init_cache(ARCH, 2, MAX_LEN))
        out = jnp.zeros((2, 5), jnp.int32).at[:, 0].set(tok)

        def body(state):
            i, tok, cache, out = state
            tok, cache = step(params, tok, cache)
            return i + 1, tok, cache, out.at[:, i].set(tok)

        return jax.lax.while_loop(lambda s: s[0] < 5, body, (1, tok, cache, out))[3]

    tok, cache = prefill(params, prompt, init_cache(ARCH, 2, MAX_LEN))
    expected = [tok]
    for _ in range(4):
        tok, cache = step(params, tok, cache)
        expected.append(tok)
    np.testing.assert_array_equal(generate(params, prompt), jnp.stack(expected, 1))


def test_bfloat16_model_runs_close_to_float32(model):
    bf16 = ModelArch(**{**ARCH.__dict__, "dtype": "bfloat16"})
    g32, p32 = split_params(model)
    p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), p32)
    m16 = nnx.merge(abstract_model(bf16)[0], p16)
    t = tokens(2, 6)
    h16, cache = m16(t, arange_positions(2, 6), cache=init_cache(bf16, 2, MAX_LEN))
    assert h16.dtype == jnp.bfloat16 and cache.k_NxBxKxSxhd.dtype == jnp.bfloat16
    logits16 = m16.logits(h16)
    assert logits16.dtype == jnp.float32
    # fp32 model on the same (bf16-rounded) weights: only activation rounding differs.
    m32 = nnx.merge(g32, jax.tree.map(lambda x: x.astype(jnp.float32), p16))
    logits32 = m32.logits(m32(t, arange_positions(2, 6))[0])
    assert float(jnp.abs(logits32).max()) > 1.0
    np.testing.assert_allclose(logits16, logits32, atol=0.1)


GEMMA = ModelArch(**{**ARCH.__dict__, "family": "gemma3", "sliding_window": 5,
                     "sliding_pattern": 3, "rope_local_theta": 100.0,
                     "query_pre_attn_scalar": 12.0})


def _gemma_params(seed=0):
    """A tiny Gemma 3 with its (1 + w) norms drawn away from their zero start."""
    graphdef, params = split_params(Qwen3(GEMMA, rngs=nnx.Rngs(seed)))
    keys = iter(jax.random.split(jax.random.key(seed), 64))
    return graphdef, jax.tree_util.tree_map_with_path(
        lambda path, x: 0.3 * jax.random.normal(next(keys), x.shape) if "norm" in str(path)
        else x, params)


def test_gemma3_training_forward_blocked_and_rematerialised_is_the_plain_one():
    """Sliding layers through the trainer's forward: 520 tokens (query blocks of 512, windows
    of 5) and remat give the unblocked, unrematerialised values and gradients."""
    from locojax.model.ops import ModelOps, masked_attention

    graphdef, params = _gemma_params()
    t = tokens(1, 520, seed=4)

    def loss(params, remat, ops):
        model = nnx.merge(graphdef, params)
        h, _ = model(t, arange_positions(1, 520), remat=remat, ops=ops)
        return jnp.sum(model.logits(h)[0, ::37] ** 2)

    plain = ModelOps(attention=masked_attention)
    want, want_grad = jax.value_and_grad(loss)(params, False, plain)
    got, got_grad = jax.jit(jax.value_and_grad(loss), static_argnums=(1, 2))(
        params, True, ModelOps())
    np.testing.assert_allclose(got, want, rtol=1e-5)
    chex.assert_trees_all_close(got_grad, want_grad, atol=1e-4, rtol=1e-4)


def test_gemma3_window_changes_only_what_lies_beyond_it():
    """A token more than `sliding_window` back reaches a query only through the full layer
    (layer 2 of 3): with every layer sliding it changes nothing at distance >= 2 windows."""
    every = ModelArch(**{**GEMMA.__dict__, "sliding_pattern": 4})  # 3 layers, none full
    assert every.sliding_layers == (True, True, True)
    graphdef, params = _gemma_params()
    t = tokens(1, 20, seed=5)
    changed = t.at[:, 2].set((t[:, 2] + 1) % ARCH.vocab)
    for arch, reaches_far in ((GEMMA, True), (every, False)):
        model = nnx.merge(abstract_model(arch)[0], params)
        a, b = (model(x, arange_positions(1, 20))[0] for x in (t, changed))
        # 3 sliding layers of window 5 carry a change at most 3 x 4 = 12 positions on.
        assert np.allclose(a[:, 15:], b[:, 15:]) != reaches_far
        assert not np.allclose(a[:, 2:7], b[:, 2:7])


def test_gemma3_given_mask_needs_its_window_mask():
    graphdef, params = _gemma_params()
    model = nnx.merge(graphdef, params)
    t = tokens(1, 4)
    with pytest.raises(TypeError, match="window_mask_BxLxS"):
        model(t, arange_positions(1, 4), mask_BxLxS=jnp.ones((1, 4, 4), bool))


SMOL = ModelArch(**{**ARCH.__dict__, "family": "smollm3", "qk_norm": False, "nope_interval": 2})


def test_smollm3_nope_layers_skip_rope_alike_scanned_and_unrolled():
    """Layer 1 of 3 applies no RoPE. Scanned and unrolled (the rollout's) forwards agree; with
    every layer NoPE, shifting all positions changes nothing, as it does with RoPE layers."""
    assert SMOL.rope_layers == (True, False, True) and SMOL.has_nope
    graphdef, params = split_params(Qwen3(SMOL, rngs=nnx.Rngs(0)))
    model = nnx.merge(graphdef, params)
    t, pos = tokens(2, 6), arange_positions(2, 6)
    scanned = model(t, pos)[0]
    layers = model.unstack_layers()
    cached = model(t, pos, cache=LayerKVCache.from_stacked(init_cache(SMOL, 2, MAX_LEN)),
                   layers=layers)[0]
    for other in (model(t, pos, layers=layers)[0], cached):
        np.testing.assert_allclose(other, scanned, atol=1e-5, rtol=1e-5)
    nope = ModelArch(**{**SMOL.__dict__, "nope_interval": 1})
    for arch, shift_free in ((nope, True), (SMOL, False)):
        m = nnx.merge(abstract_model(arch)[0], params)
        a, b = m(t, pos)[0], m(t, pos + 7)[0]
        assert bool(jnp.array_equal(a, b)) == shift_free


def test_smollm3_training_forward_rematerialised_is_the_plain_one():
    """NoPE layers through the trainer's forward: remat (each block a checkpoint, the flags
    scanned beside the weights) gives the plain values and gradients."""
    graphdef, params = split_params(Qwen3(SMOL, rngs=nnx.Rngs(2)))
    t = tokens(2, 7, seed=6)

    def loss(params, remat):
        model = nnx.merge(graphdef, params)
        h, _ = model(t, arange_positions(2, 7), remat=remat)
        return jnp.sum(model.logits(h) ** 2)

    want, want_grad = jax.value_and_grad(loss)(params, False)
    got, got_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, True)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    chex.assert_trees_all_close(got_grad, want_grad, atol=1e-4, rtol=1e-4)

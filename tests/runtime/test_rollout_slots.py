"""The engine's prefill and slots: one prefill per prompt gives the repeated path's results, and
the schedule (static, waves, refill; any slot count) never changes a row's tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from locojax.model import ModelArch, Qwen3, split_params
from locojax.rollout.engine import EngineOptions, generate
from locojax.rollout.sampler import SamplingSettings

ARCH = ModelArch(num_layers=2, hidden=128, num_heads=4, num_kv_heads=2, head_dim=32, ffn=256,
                 vocab=640, dtype="float32")
PROMPTS = [[5, 17, 301, 44], [9], [100, 200, 300, 400, 7, 8, 9], [3, 3], [600, 1, 2]]
# About one token in ten stops a row: lengths spread from 1 to T.
SAMPLED = SamplingSettings(max_new_tokens=20, stop_ids=tuple(range(1, 65)))
GREEDY = SamplingSettings(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def model():
    return split_params(Qwen3(ARCH, rngs=nnx.Rngs(0)))


def _run(model, settings, key=0, group_size=4, **options):
    options.setdefault("cpu_kernels", "off")
    return generate(model, PROMPTS, settings, jax.random.key(key), group_size=group_size,
                    options=EngineOptions(**options))


@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_shared_prefill_equals_the_repeated_path(model, settings):
    shared = _run(model, settings)
    repeated = _run(model, settings, prefill="repeated")
    assert shared.stats.prefill_rows == len(PROMPTS)
    assert repeated.stats.prefill_rows == 4 * len(PROMPTS)
    np.testing.assert_array_equal(shared.tokens_BxL, repeated.tokens_BxL)
    np.testing.assert_array_equal(shared.lengths_B, repeated.lengths_B)
    np.testing.assert_allclose(shared.logp_model_BxT, repeated.logp_model_BxT, atol=1e-5, rtol=0)
    np.testing.assert_allclose(shared.logp_BxT, repeated.logp_BxT, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(shared.prompt_len_B, np.repeat([len(p) for p in PROMPTS], 4))


def test_schedules_give_the_same_tokens(model):
    runs = {
        "static, every row resident": _run(model, SAMPLED, schedule="static"),
        "static, waves of 6": _run(model, SAMPLED, schedule="static", slots=6),
        "refill, 6 slots": _run(model, SAMPLED, slots=6),
        "refill, 7 slots": _run(model, SAMPLED, slots=7),
        "refill, 1 slot": _run(model, SAMPLED, slots=1),
    }
    want = runs["static, every row resident"]
    lengths = np.asarray(want.lengths_B)
    assert lengths.min() < 5 and lengths.max() > 15, lengths  # a spread the slots can use
    for name, r in runs.items():
        np.testing.assert_array_equal(r.tokens_BxL, want.tokens_BxL, err_msg=name)
        np.testing.assert_array_equal(r.lengths_B, want.lengths_B, err_msg=name)
        np.testing.assert_allclose(r.logp_BxT, want.logp_BxT, atol=1e-5, rtol=0, err_msg=name)
        # Token 0 comes from the prefill; every later token is one live slot-step.
        assert int(r.stats.live_slot_steps_R.sum()) == int((lengths - 1).sum()), name
    waves, refill = runs["static, waves of 6"].stats, runs["refill, 6 slots"].stats
    assert int(refill.decode_steps_R[0]) < int(waves.decode_steps_R[0])
    assert refill.idle_share() < waves.idle_share()
    # One slot decodes one row at a time: every step is live.
    assert runs["refill, 1 slot"].stats.idle_share() == 0.0
    assert int(runs["static, every row resident"].stats.decode_steps_R[0]) == lengths.max() - 1


def test_a_key_per_row_and_token(model):
    """Other keys draw other tokens; a row's draws do not depend on the rows beside it."""
    a, b = _run(model, SAMPLED, key=1), _run(model, SAMPLED, key=2)
    assert not np.array_equal(a.completion_BxT, b.completion_BxT)
    fewer = generate(model, PROMPTS[:2], SAMPLED, jax.random.key(1), group_size=4,
                     options=EngineOptions(cpu_kernels="off", slots=3))
    np.testing.assert_array_equal(fewer.completion_BxT, np.asarray(a.completion_BxT)[:8])


def test_rows_ending_at_their_first_token_never_take_a_slot(model):
    logits_stop = SamplingSettings(temperature=0.0, max_new_tokens=6,
                                   stop_ids=tuple(range(ARCH.vocab)))
    r = _run(model, logits_stop, slots=2)
    np.testing.assert_array_equal(r.lengths_B, 1)
    assert int(r.stats.decode_steps_R[0]) == 0
    one = _run(model, SamplingSettings(max_new_tokens=1))
    np.testing.assert_array_equal(one.lengths_B, 1)


def test_bf16_weights_and_kv(model):
    graphdef, params = model
    bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    r = _run((graphdef, bf16), GREEDY, slots=5)
    f32 = _run(model, GREEDY, slots=5, kv_dtype="bfloat16")
    for out in (r, f32):
        assert out.completion_BxT.shape == (20, GREEDY.max_new_tokens)
        assert np.all(np.isfinite(np.asarray(out.logp_model_BxT)))
    # bf16 KV under fp32 weights stays close to fp32 KV.
    full = _run(model, GREEDY, slots=5)
    assert np.mean(np.asarray(f32.completion_BxT) == np.asarray(full.completion_BxT)) > 0.8


def test_stacked_layers_equal_unrolled(model):
    """Accelerators scan the stacked weights (no per-layer copy): the same rows as unrolled."""
    unrolled = _run(model, SAMPLED, slots=6, stacked_layers=False)
    stacked = _run(model, SAMPLED, slots=6, stacked_layers=True)
    np.testing.assert_array_equal(stacked.tokens_BxL, unrolled.tokens_BxL)
    np.testing.assert_allclose(stacked.logp_BxT, unrolled.logp_BxT, atol=1e-5, rtol=0)


@pytest.mark.parametrize("stacked", [False, True], ids=["unrolled", "stacked"])
def test_a_chunked_store_gives_the_whole_stores_rows(model, stacked):
    """A store of one prompt at a time (each next prompt prefilled inside the slot loop once
    the stored prompt's rows are all in slots) gives the rows of a store of every prompt."""
    whole = _run(model, SAMPLED, slots=6, stacked_layers=stacked)
    assert whole.stats.prefill_rows == len(PROMPTS)
    lengths = np.asarray(whole.lengths_B)
    # The layer loop (stacked or unrolled) is one code path under every schedule
    # (test_stacked_layers_equal_unrolled); the unrolled one takes the fewest slots only.
    every = (dict(slots=6), dict(slots=3), dict(slots=6, schedule="static"), dict(slots=20))
    for options in every if stacked else every[1:2]:
        r = _run(model, SAMPLED, store_prompts=1, stacked_layers=stacked, **options)
        assert r.stats.prefill_rows == 1, options
        np.testing.assert_array_equal(r.tokens_BxL, whole.tokens_BxL, err_msg=str(options))
        np.testing.assert_array_equal(r.lengths_B, whole.lengths_B, err_msg=str(options))
        np.testing.assert_allclose(r.logp_BxT, whole.logp_BxT, atol=1e-5, rtol=0)
        np.testing.assert_allclose(r.logp_model_BxT, whole.logp_model_BxT, atol=1e-5, rtol=0)
        assert int(r.stats.live_slot_steps_R.sum()) == int((lengths - 1).sum()), options
    # Rows that end at token 0 of a later chunk's prefill leave at once.
    stop_all = SamplingSettings(temperature=0.0, max_new_tokens=6,
                                stop_ids=tuple(range(ARCH.vocab)))
    r = _run(model, stop_all, slots=2, store_prompts=1, stacked_layers=stacked)
    np.testing.assert_array_equal(r.lengths_B, 1)
    if stacked:  # A bound that does not divide the 5 prompts: the largest divisor within it.
        assert _run(model, GREEDY, store_prompts=4).stats.prefill_rows == 1
        assert _run(model, GREEDY, store_prompts=5).stats.prefill_rows == 5

"""The compiled rollout: log-probs equal a teacher-forced forward, greedy equals transformers,
stop tokens end rows, seeds determine results, and a 2-device batch mesh gives the same."""


import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh
from paths import FIXTURES

from locojax.model import abstract_model, load_hf_checkpoint
from locojax.rollout.engine import (
    EngineOptions,
    Rollout,
    generate,
    lower_programs,
    pad_prompts,
)
from locojax.rollout.sampler import SamplingSettings

PROMPTS = [[5, 17, 301, 44], [9], [100, 200, 300, 400, 7, 8, 9], [3, 3]]


# One sampled-settings value shared by several tests, so they share one compiled program.
SAMPLED = SamplingSettings(max_new_tokens=12, stop_ids=(7, 11, 13, 17, 19))


def _load(name: str):
    arch, params = load_hf_checkpoint(FIXTURES / name)
    graphdef, _ = abstract_model(arch)
    return graphdef, params, dict(np.load(FIXTURES / name / "expected.npz"))


@pytest.fixture(scope="module")
def fixture():
    """The untied fixture (its greedy continuation is varied; the tied one repeats a token)."""
    return _load("tiny_qwen3")


def teacher_forced_logits(graphdef, params, r: Rollout) -> jax.Array:
    """Logits predicting each completion token, from one full forward over prompt + completion."""
    model = nnx.merge(graphdef, params)
    hidden_BxLxD, _ = model(r.tokens_BxL, r.positions_BxL(), kv_valid_BxS=r.valid_BxL())
    width, t = r.prompt_width, r.completion_BxT.shape[1]
    return model.logits(hidden_BxLxD)[:, width - 1 : width - 1 + t]


def teacher_forced_logp(graphdef, params, r: Rollout, temperature=1.0) -> jax.Array:
    """Log-probs of the completion under the model softmax (at `temperature`) of a full
    forward pass."""
    logits = teacher_forced_logits(graphdef, params, r) / temperature
    logp_BxTxV = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(logp_BxTxV, r.completion_BxT[..., None], axis=-1)[..., 0]


def test_logp_equals_teacher_forcing(fixture):
    graphdef, params, _ = fixture
    r = generate((graphdef, params), PROMPTS, SAMPLED, jax.random.key(0), group_size=3)
    assert r.completion_BxT.shape == (12, 12) and r.tokens_BxL.shape == (12, 7 + 12)
    want = teacher_forced_logp(graphdef, params, r) * r.mask_BxT
    np.testing.assert_allclose(r.logp_BxT, want, atol=1e-4)
    np.testing.assert_array_equal(r.logp_BxT, r.logp_model_BxT)  # T=1, no truncation
    assert np.all(np.asarray(r.logp_BxT)[np.asarray(r.mask_BxT) == 1] <= 0)
    # Rows of one prompt share it and (almost surely) differ in completions.
    np.testing.assert_array_equal(r.prompt_len_B, np.repeat([4, 1, 7, 2], 3))
    assert len({tuple(row) for row in np.asarray(r.completion_BxT)[:3]}) > 1


def test_truncated_sampling_reports_both_logps(fixture):
    graphdef, params, _ = fixture
    settings = SamplingSettings(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=8)
    r = generate((graphdef, params), PROMPTS, settings, jax.random.key(1), group_size=2)
    model_logp = teacher_forced_logp(graphdef, params, r, temperature=0.7)
    np.testing.assert_allclose(r.logp_model_BxT, model_logp * r.mask_BxT, atol=1e-4)
    # Behaviour log-probs: softmax(logits / 0.7) cut to the top 20, then to the 0.9 nucleus.
    logits_BxTxV = np.asarray(teacher_forced_logits(graphdef, params, r), np.float64) / 0.7
    for b, t in np.ndindex(*r.completion_BxT.shape):
        order = np.argsort(-logits_BxTxV[b, t])[:20]
        p = np.exp(logits_BxTxV[b, t, order] - logits_BxTxV[b, t, order].max())
        p /= p.sum()
        kept = order[np.cumsum(p) - p < 0.9]
        token = int(r.completion_BxT[b, t])
        assert token in kept
        lse = np.log(np.exp(logits_BxTxV[b, t, kept]).sum())
        np.testing.assert_allclose(r.logp_BxT[b, t], logits_BxTxV[b, t, token] - lse, atol=1e-4)


@pytest.mark.parametrize("name", ["tiny_qwen3", "tiny_qwen3_tied_sharded", "tiny_qwen2",
                                  "tiny_llama", "tiny_gemma3", "tiny_smollm3"])
def test_greedy_equals_transformers(name):
    graphdef, params, expected = _load(name)
    want_BxT = expected["greedy_new_BxT"]
    settings = SamplingSettings(temperature=0.0, max_new_tokens=want_BxT.shape[1])
    prompts = (expected["greedy_prompts_BxP"], expected["greedy_prompt_lens_B"])
    r = generate((graphdef, params), prompts, settings, jax.random.key(0))
    np.testing.assert_array_equal(r.completion_BxT, want_BxT)
    np.testing.assert_array_equal(r.logp_BxT, 0.0)
    np.testing.assert_array_equal(r.lengths_B, want_BxT.shape[1])


@pytest.mark.parametrize(("name", "options"), [
    ("tiny_gemma3", {"slots": 1, "cpu_kernels": "off", "stacked_layers": True}),
    ("tiny_gemma3", {"slots": 1, "cpu_kernels": "on", "stacked_layers": False}),
    ("tiny_gemma3", {"slots": 2, "cpu_kernels": "off", "stacked_layers": False}),
    ("tiny_smollm3", {"slots": 1, "cpu_kernels": "on", "stacked_layers": False}),
    ("tiny_smollm3", {"slots": 2, "cpu_kernels": "off", "stacked_layers": True}),
])
def test_layer_options_greedy_in_every_engine_layout(name, options):
    """Gemma 3's sliding layers (window 6, prompts to 41 tokens) and SmolLM3's NoPE layers (2
    of 4) in the slot ring: one slot refilled (the second row's ring starts mid-cache) or two,
    scanned or unrolled layers, the CPU decode kernels on or off: transformers' greedy tokens
    each time."""
    graphdef, params, expected = _load(name)
    want_BxT = expected["greedy_new_BxT"]
    settings = SamplingSettings(temperature=0.0, max_new_tokens=want_BxT.shape[1])
    prompts = (expected["greedy_prompts_BxP"], expected["greedy_prompt_lens_B"])
    r = generate((graphdef, params), prompts, settings, jax.random.key(0),
                 options=EngineOptions(**options))
    np.testing.assert_array_equal(r.completion_BxT, want_BxT)


@pytest.mark.parametrize("stacked", [False, True])
def test_sliding_layers_keep_only_their_window_in_the_slot_loop(stacked):
    """Gemma 3's two sliding layers (window 6) keep a 6-column ring per slot, its full layer
    the slot's W + T = 9 + 12 columns, in either layout of the weights (the greedy and
    teacher-forcing tests above hold the tokens read through them)."""
    graphdef, params, expected = _load("tiny_gemma3")
    prompts = (expected["greedy_prompts_BxP"], expected["greedy_prompt_lens_B"])
    assert prompts[0].shape == (2, 9)
    _, slots = lower_programs((graphdef, params), prompts,
                              SamplingSettings(temperature=0.0, max_new_tokens=12),
                              group_size=2, options=EngineOptions(stacked_layers=stacked,
                                                                  cpu_kernels="off"))
    # Keys, slots x kv heads x head dim x columns: 4 slots (2 prompts x 2); 1 column: a
    # step's new key.
    keys = re.findall(r"tensor<4x1x16x(\d+)xf32>", slots.as_text())
    assert sorted(set(map(int, keys)) - {1}) == [6, 21]


@pytest.mark.parametrize("name", ["tiny_gemma3", "tiny_smollm3"])
def test_sampled_logp_equals_teacher_forcing_past_the_window(name):
    """Sampled rows of up to 7 + 12 tokens (Gemma's window is 6; SmolLM3's NoPE layers), two
    slots refilled around the ring: the engine's log-probs equal one full forward's (the
    trainer's form of the model)."""
    graphdef, params, _ = _load(name)
    settings = SamplingSettings(max_new_tokens=12)
    r = generate((graphdef, params), PROMPTS, settings, jax.random.key(3), group_size=3,
                 options=EngineOptions(slots=2))
    assert int(r.lengths_B.max()) == 12
    want = teacher_forced_logp(graphdef, params, r) * r.mask_BxT
    np.testing.assert_allclose(r.logp_BxT, want, atol=1e-4)


def test_stop_tokens_end_rows_and_mask_after(fixture):
    graphdef, params, expected = fixture
    greedy_BxT = expected["greedy_new_BxT"]
    stops = (int(greedy_BxT[0, 4]), int(greedy_BxT[1, 9]))
    settings = SamplingSettings(temperature=0.0, max_new_tokens=16, stop_ids=stops, pad_id=0)
    prompts = (expected["greedy_prompts_BxP"], expected["greedy_prompt_lens_B"])
    r = generate((graphdef, params), prompts, settings, jax.random.key(0))
    for row in range(2):
        first = int(np.argmax(np.isin(greedy_BxT[row], stops)))
        assert first < 15, "fixture choice: each row must stop before the last token"
        assert r.lengths_B[row] == first + 1
        np.testing.assert_array_equal(r.completion_BxT[row, : first + 1], greedy_BxT[row, : first + 1])
        np.testing.assert_array_equal(r.completion_BxT[row, first + 1 :], 0)
        np.testing.assert_array_equal(r.mask_BxT[row], np.arange(16) <= first)
        np.testing.assert_array_equal(r.logp_model_BxT[row, first + 1 :], 0.0)


def test_deterministic_given_the_seed(fixture):
    graphdef, params, _ = fixture
    a = generate((graphdef, params), PROMPTS, SAMPLED, jax.random.key(5), group_size=3)
    b = generate((graphdef, params), PROMPTS, SAMPLED, jax.random.key(5), group_size=3)
    c = generate((graphdef, params), PROMPTS, SAMPLED, jax.random.key(6), group_size=3)
    np.testing.assert_array_equal(a.tokens_BxL, b.tokens_BxL)
    np.testing.assert_array_equal(a.logp_BxT, b.logp_BxT)
    assert not np.array_equal(a.tokens_BxL, c.tokens_BxL)


def test_two_device_batch_mesh(fixture):
    graphdef, params, _ = fixture
    mesh = Mesh(np.array(jax.devices()[:2]).reshape(2, 1), ("replica", "tensor"))
    key = jax.random.key(2)
    r = generate((graphdef, params), PROMPTS, SAMPLED, key, group_size=3, mesh=mesh)
    assert r.completion_BxT.sharding.spec[0] == "replica"
    assert len(r.completion_BxT.sharding.device_set) == 2
    np.testing.assert_allclose(
        r.logp_BxT, teacher_forced_logp(graphdef, params, r) * r.mask_BxT, atol=1e-4
    )
    one = generate((graphdef, params), PROMPTS, SAMPLED, key, group_size=3)
    np.testing.assert_array_equal(r.tokens_BxL, one.tokens_BxL)  # same random bits per row
    with pytest.raises(ValueError, match="do not split"):
        generate((graphdef, params), PROMPTS[:3], SAMPLED, key, mesh=mesh)


def test_pad_prompts_left_pads():
    tokens, lens = pad_prompts([[1, 2], [3, 4, 5]], pad_id=9, length=4)
    np.testing.assert_array_equal(tokens, [[9, 9, 1, 2], [9, 3, 4, 5]])
    np.testing.assert_array_equal(lens, [2, 3])
    with pytest.raises(ValueError, match="prompt lengths"):
        pad_prompts([[1, 2, 3]], length=2)

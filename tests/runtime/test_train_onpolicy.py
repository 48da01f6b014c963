"""On-policy scoring: the trainer's log-probs at the sampling temperature are the engine's."""

import dataclasses

import jax
import numpy as np
from flax import nnx
from test_train_step import ARCH

from locojax.model import Qwen3, split_params
from locojax.rollout.engine import generate
from locojax.rollout.sampler import SamplingSettings
from locojax.train.settings import ForwardSettings
from locojax.train.step import make_logprob_fn

PROMPTS = [[5, 6, 7, 8], [9], [10, 11, 12, 13, 14, 15], [16, 17]]


def test_trainer_logprobs_at_temperature_equal_the_engines():
    graphdef, params = split_params(Qwen3(ARCH, rngs=nnx.Rngs(3)))
    settings = SamplingSettings(temperature=0.7, max_new_tokens=8, stop_ids=(1,))
    r = generate((graphdef, params), PROMPTS, settings, jax.random.key(0), group_size=2)
    width, t = r.prompt_width, r.completion_BxT.shape[1]
    mask = np.asarray(r.mask_BxT) > 0
    args = (r.tokens_BxL, r.positions_BxL(), r.valid_BxL())
    fwd = ForwardSettings(response_len=t, temperature=0.7, vocab_chunk=64)
    trainer = np.asarray(make_logprob_fn(graphdef, forward=fwd, chunks=2)(params, *args))
    assert np.all(trainer[:, :width] == 0.0)
    trainer = trainer[:, width:]
    # Nothing is truncated, so the sampling distribution is softmax(z / 0.7) itself.
    np.testing.assert_allclose(trainer[mask], np.asarray(r.logp_BxT)[mask], atol=1e-4)
    np.testing.assert_allclose(trainer[mask], np.asarray(r.logp_model_BxT)[mask], atol=1e-4)
    # At temperature 1 the trainer scores another distribution: the comparison has teeth.
    plain = make_logprob_fn(graphdef, forward=dataclasses.replace(fwd, temperature=1.0))
    plain = np.asarray(plain(params, *args))[:, width:]
    assert np.abs(plain[mask] - np.asarray(r.logp_BxT)[mask]).max() > 1e-2

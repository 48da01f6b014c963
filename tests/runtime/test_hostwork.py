"""Host work in numpy: the rows it builds equal the rollout's own positions and masks, and the
per-kind timing adds up; a rollout gathered from several hosts concatenates in host order."""

import jax.numpy as jnp
import numpy as np
import pytest

from locojax.rollout.engine import Rollout
from locojax.runtime.hostwork import HOST_KINDS, Completions, HostTimes, train_rows


def _rollout(b=6, width=5, t=4, seed=0) -> Rollout:
    rng = np.random.default_rng(seed)
    prompt_len = rng.integers(1, width + 1, b).astype(np.int32)
    lengths = rng.integers(1, t + 1, b).astype(np.int32)
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
    tokens = rng.integers(0, 50, (b, width + t)).astype(np.int32)
    logp = -rng.random((b, t)).astype(np.float32) * mask
    return Rollout(tokens_BxL=jnp.asarray(tokens), completion_BxT=jnp.asarray(tokens[:, width:]),
                   logp_BxT=jnp.asarray(logp), logp_model_BxT=jnp.asarray(logp),
                   mask_BxT=jnp.asarray(mask), lengths_B=jnp.asarray(lengths),
                   prompt_len_B=jnp.asarray(prompt_len))


def test_rows_match_the_rollouts_positions_and_masks():
    r = _rollout()
    rows = train_rows(Completions.of(r), np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(rows["positions_BxL"], np.asarray(r.positions_BxL()))
    np.testing.assert_array_equal(rows["valid_BxL"], np.asarray(r.valid_BxL()))
    width = r.prompt_width
    np.testing.assert_array_equal(rows["loss_mask_BxL"][:, width:], np.asarray(r.mask_BxT) > 0)
    assert not rows["loss_mask_BxL"][:, :width].any()
    np.testing.assert_array_equal(rows["behaviour_logp_BxL"][:, width:], np.asarray(r.logp_BxT))
    assert rows["advantages_B"].dtype == np.float32


def test_completions_of_two_hosts_concatenate_in_host_order():
    a, b = Completions.of(_rollout(seed=1)), Completions.of(_rollout(b=4, seed=2))
    both = Completions.concat([a, b])
    assert both.tokens_BxL.shape[0] == 10 and both.prompt_width == a.prompt_width
    np.testing.assert_array_equal(both.lengths_B[6:], b.lengths_B)
    assert both.nbytes == a.nbytes + b.nbytes


def test_host_times_fields_per_kind_and_per_sample():
    times = HostTimes(samples=4)
    times.add("score", 0.2)
    times.add("score", 0.2)
    out = times.fields()
    assert {f"host_{k}_s" for k in HOST_KINDS} <= set(out)
    assert out["host_score_s"] == pytest.approx(0.4)
    assert out["host_score_s_per_sample"] == pytest.approx(0.1)
    assert out["host_dispatch_s"] == 0.0 and out["host_dispatches"] == 0


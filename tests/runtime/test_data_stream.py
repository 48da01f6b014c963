"""Prompt streams: per-epoch permutations, (seed, step)-pure batches, host slices, resume."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from locojax.data import DataPosition, PromptStream, shard, shard_bounds


def test_every_epoch_visits_each_problem_once_in_a_new_order():
    stream = PromptStream(num_problems=50, prompts_per_step=10, position=DataPosition(seed=1))
    epochs = np.concatenate([stream.next() for _ in range(15)]).reshape(3, 50)
    for order in epochs:
        assert sorted(order) == list(range(50))
    assert not np.array_equal(epochs[0], epochs[1])


def test_batches_depend_on_seed_and_step_only():
    a = PromptStream(1319, 24, DataPosition(seed=7))
    b = PromptStream(1319, 24, DataPosition(seed=7))
    np.testing.assert_array_equal(a.batch(100), b.batch(100))
    for step in range(5):
        np.testing.assert_array_equal(a.next(), b.batch(step))
    assert a.step == 5 and a.position == DataPosition(seed=7, consumed=120)
    other = PromptStream(1319, 24, DataPosition(seed=8))
    assert not np.array_equal(other.batch(0), b.batch(0))


def test_a_batch_spanning_two_epochs_is_the_tail_then_the_head():
    stream = PromptStream(num_problems=10, prompts_per_step=4, position=DataPosition(seed=0))
    batches = [stream.batch(s) for s in range(5)]  # positions 0..19: two whole epochs
    flat = np.concatenate(batches)
    assert sorted(flat[:10]) == sorted(flat[10:]) == list(range(10))
    np.testing.assert_array_equal(batches[2][:2], flat[8:10])


@pytest.mark.parametrize("hosts", [1, 2, 3, 4, 6, 8])
def test_host_slices_concatenate_to_the_global_batch(hosts):
    stream = PromptStream(7473, 24, DataPosition(seed=0))
    for step in (0, 311, 312, 1000):  # 7473 / 24 = 311.4: step 311 crosses an epoch
        bounds = [shard_bounds(24, h, hosts) for h in range(hosts)]
        parts = [stream.batch(step, lo, hi) for lo, hi in bounds]
        np.testing.assert_array_equal(np.concatenate(parts), stream.batch(step))


def test_resume_from_a_saved_position_continues_exactly():
    straight = PromptStream(100, 24, DataPosition(seed=3))
    expected = [straight.next(start=6, stop=12) for _ in range(12)]
    first = PromptStream(100, 24, DataPosition(seed=3))
    got = [first.next(start=6, stop=12) for _ in range(5)]
    state = first.position.to_dict()
    resumed = PromptStream(100, 24, DataPosition.from_dict(dict(state)))
    got += [resumed.next(start=6, stop=12) for _ in range(7)]
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(e, g)


def test_bad_slices_and_positions_raise():
    stream = PromptStream(10, 4, DataPosition(seed=0, consumed=3))
    with pytest.raises(ValueError, match="slice"):
        stream.batch(0, 3, 5)
    with pytest.raises(ValueError, match="multiple"):
        stream.next()
    with pytest.raises(ValueError):
        shard_bounds(10, 2, 2)


@given(n=st.integers(0, 500), hosts=st.integers(1, 64))
def test_shards_are_disjoint_contiguous_and_cover_everything(n, hosts):
    blocks = [shard(range(n), h, hosts) for h in range(hosts)]
    assert [x for b in blocks for x in b] == list(range(n))
    sizes = [len(b) for b in blocks]
    assert max(sizes) - min(sizes) <= 1

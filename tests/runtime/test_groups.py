"""Dynamic sampling's group selection (`runtime.groups`): the planned batch shape, exactly the
all-equal groups dropped, the bound, and deterministic extra prompts."""

import numpy as np
import pytest
from compiler_cases import make_config

from compiler import compile_plan
from locojax.data import PromptStream, load_workload
from locojax.data.stream import DataPosition
from locojax.runtime import assemble
from locojax.runtime.groups import GroupPool, batch_problems, pick_groups, zero_std
from locojax.runtime.hostwork import Completions, HostWork
from locojax.runtime.steps import step_problems
from locojax.train.advantages import group_advantages

G = 4
# Hand-made rewards of 6 groups of 4: which agree (zero std) is known by construction.
REWARDS_PxG = np.array([[1, 1, 1, 1],        # all right: zero std
                        [0, 1, 0, 0],        # informative
                        [0, 0, 0, 0],        # all wrong: zero std
                        [0.1, 0.1, 0.1, 0.1],  # all formatted, all wrong: zero std
                        [0.1, 0, 1, 0],      # informative
                        [1, 1, 1, 0.1]],     # informative
                       np.float32)
ZERO = np.array([True, False, True, True, False, False])


def test_zero_std_is_exactly_the_groups_whose_rewards_all_agree():
    assert zero_std(REWARDS_PxG.reshape(-1), G).tolist() == ZERO.tolist()


def test_filter_keeps_the_first_informative_groups_and_drops_exactly_the_all_equal():
    pick = pick_groups(ZERO, 3, filtering=True)
    assert pick.index_N.tolist() == [1, 4, 5] and pick.weight_N.all()
    # Fewer informative groups than wanted: the first zero-std ones fill in with zero weight.
    pick = pick_groups(ZERO, 4, filtering=True)
    assert pick.index_N.tolist() == [0, 1, 4, 5]
    assert pick.weight_N.tolist() == [False, True, True, True]
    # Off: the step's own groups, all trained.
    pick = pick_groups(ZERO, 3, filtering=False)
    assert pick.index_N.tolist() == [0, 1, 2] and pick.weight_N.all()
    with pytest.raises(ValueError):
        pick_groups(ZERO[:2], 3, filtering=True)


@pytest.fixture(scope="module")
def work():
    plan = compile_plan(make_config(overrides={"workload": {"group_size": G}}))
    return HostWork(plan, tokenizer=None, scorer=None)  # rows() reads the plan alone


def _completions(batch: int, groups: int, width: int = 3, t: int = 5) -> Completions:
    """`groups` x G rows whose tokens name (batch, row), so a kept row can be traced."""
    b = groups * G
    tokens = np.zeros((b, width + t), np.int32)
    tokens[:, 0] = batch
    tokens[:, 1] = np.arange(b)
    return Completions(tokens_BxL=tokens, mask_BxT=np.ones((b, t), bool),
                       logp_model_BxT=np.full((b, t), -0.5, np.float32),
                       logp_BxT=np.full((b, t), -0.5, np.float32),
                       lengths_B=np.full(b, t, np.int32), prompt_len_B=np.full(b, width, np.int32))


def test_the_pool_samples_until_filled_and_keeps_the_planned_shape(work):
    want = 3  # the host's prompts per step
    pool = GroupPool(want, G, filtering=True, max_batches=3)
    assert pool.wanting  # nothing sampled yet
    pool.add(_completions(0, want), REWARDS_PxG[:3].reshape(-1), rollout_s=1.0)
    assert pool.wanting  # 1 informative group of 3
    pool.add(_completions(1, want), REWARDS_PxG[3:].reshape(-1), rollout_s=2.0)
    assert not pool.wanting  # 3 informative groups: filled before the bound
    rows, counts = pool.rows(work)
    assert rows["tokens_BxL"].shape[0] == want * G  # the planned rows
    kept = [(int(b), int(r) // G) for b, r in rows["tokens_BxL"][::G, :2]]
    assert kept == [(0, 1), (1, 1), (1, 2)]  # groups 1, 4, 5 of the hand-made rewards
    assert rows["loss_mask_BxL"].any(axis=1).all()
    want_adv = group_advantages(REWARDS_PxG[[1, 4, 5]]).reshape(-1)
    np.testing.assert_array_equal(rows["advantages_B"], want_adv)
    assert (counts.sampled, counts.zero_std, counts.padded, counts.batches) == (6, 3, 0, 2)
    assert counts.extra_rollout_s == 2.0


def test_at_the_bound_zero_std_groups_fill_in_with_zero_weight(work):
    pool = GroupPool(3, G, filtering=True, max_batches=2)
    pool.add(_completions(0, 3), REWARDS_PxG[:3].reshape(-1), 1.0)
    assert pool.wanting  # one informative group of 3
    pool.add(_completions(1, 3), np.ones(3 * G, np.float32), 1.0)
    assert not pool.wanting  # the bound: 2 batches
    rows, counts = pool.rows(work)
    assert rows["tokens_BxL"].shape[0] == 3 * G
    informative_B = np.repeat([False, True, False], G)  # groups 0, 1, 2 of batch 0
    assert (rows["loss_mask_BxL"].any(axis=1) == informative_B).all()
    assert (rows["advantages_B"][~informative_B] == 0).all()
    assert (counts.padded, counts.batches, counts.zero_std, counts.sampled) == (2, 2, 5, 6)


def test_off_trains_the_one_batch_as_before(work):
    pool = GroupPool(3, G, filtering=False, max_batches=10)
    c = _completions(0, 3)
    pool.add(c, REWARDS_PxG[:3].reshape(-1), 1.0)
    assert not pool.wanting and pool.max_batches == 1
    rows, counts = pool.rows(work)
    before = work.rows(c, REWARDS_PxG[:3].reshape(-1))
    for k, v in before.items():
        np.testing.assert_array_equal(rows[k], v)
    assert (counts.sampled, counts.zero_std, counts.padded, counts.batches) == (3, 2, 0, 1)


def test_extra_batches_come_from_the_hosts_range_of_a_second_stream():
    w = load_workload(assemble.workload_settings(make_config().workload), 0)
    stream = PromptStream(len(w.train), 6, DataPosition(0))
    uids = lambda ps: [p.uid for p in ps]  # noqa: E731
    first = batch_problems(w, stream, 2, (2, 4), 0, 3)
    assert uids(first) == uids(step_problems(w, stream, 2, (2, 4)))
    extra = [batch_problems(w, stream, 2, (2, 4), k, 3) for k in (1, 2)]
    assert uids(extra[0]) == uids(batch_problems(w, stream, 2, (2, 4), 1, 3))  # a pure function
    assert len({tuple(uids(b)) for b in [first, *extra]}) == 3
    # The hosts' ranges of one extra batch partition it, as the step's own prompts do.
    whole = batch_problems(w, stream, 2, (0, 6), 1, 3)
    parts = batch_problems(w, stream, 2, (0, 2), 1, 3) + batch_problems(w, stream, 2, (2, 6), 1, 3)
    assert uids(whole) == uids(parts)
    # The next step's own prompts are untouched by the extra stream.
    assert uids(step_problems(w, stream, 3, (0, 6))) != uids(whole)

"""Multi-turn generation with the KV cache kept across turns (`rollout.episodes`): each turn
prefills only the tokens an episode gained, and its replies and log-probs are those of a full
prefill of the whole transcript (the slot engine, `rollout.engine.generate`, whose log-probs
test_rollout holds against a teacher-forced forward)."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from paths import FIXTURES

from locojax.model import abstract_model, load_hf_checkpoint
from locojax.rollout.engine import generate, pad_prompts
from locojax.rollout.episodes import EpisodeCache, Feed, piece_width
from locojax.rollout.sampler import SamplingSettings

R = 5
SAMPLED = SamplingSettings(max_new_tokens=R, stop_ids=(7, 11))
GREEDY = SamplingSettings(temperature=0.0, max_new_tokens=R)
OPENINGS = [[5, 17, 301, 44], [9], [100, 200, 300, 400, 7, 8, 9, 12, 13, 14]]
MESSAGES = [[61, 62, 63], [70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86],
            []]
"""What each episode's environment adds after turn 0 (the third episode ended)."""


@pytest.fixture(scope="module")
def model():
    arch, params = load_hf_checkpoint(FIXTURES / "tiny_qwen3")
    return abstract_model(arch)[0], params


def _full(model, transcripts, settings, key):
    """The slot engine on each whole transcript, row b at row b, left-padded to 48 columns
    (one compiled program a setting): ids, log-probs, lengths."""
    r = generate(model, pad_prompts(transcripts, length=48), settings, key)
    return (np.asarray(r.completion_BxT), np.asarray(r.logp_model_BxT),
            np.asarray(r.lengths_B))


def _run(model, settings, mesh=None):
    """Two turns of three episodes: per turn the cache's replies, the rows that took part and
    every row's transcript before the turn's reply."""
    graphdef, params = model
    cache = EpisodeCache(graphdef, params, settings, width=64, mesh=mesh)
    cache.start(len(OPENINGS))
    transcripts = [list(x) for x in OPENINGS]
    new, turns = [list(x) for x in OPENINGS], []
    for t in range(2):
        live = [b for b, x in enumerate(new) if x]
        got = cache.turn(new, _key(t))
        turns.append((got, live, [x[:] for x in transcripts]))
        new = [[] for _ in OPENINGS]
        for b in live:
            reply = got.ids_BxR[b, :int(got.lengths_B[b])].tolist()
            transcripts[b] += reply + MESSAGES[b]
            new[b] = ([reply[-1]] + MESSAGES[b]) if MESSAGES[b] else []
    return cache, turns


def _key(turn: int) -> jax.Array:
    return jax.random.fold_in(jax.random.key(3), turn)


@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_incremental_prefill_equals_full_prefill(model, settings):
    """Turn 1 feeds each episode only its reply's last token and the environment's tokens
    (3, and 17 in two pieces); its replies and log-probs are the whole transcripts' (draws
    keyed by (key, row, token) as the slot engine's: the same uniforms for row b, so sampled
    replies match too, stop ids ending rows early)."""
    cache, turns = _run(model, settings)
    for t, (got, live, transcripts) in enumerate(turns):
        ids, logp, lengths = _full(model, transcripts, settings, _key(t))
        for b in live:
            n = int(got.lengths_B[b])
            assert n == lengths[b]
            np.testing.assert_array_equal(got.ids_BxR[b, :n], ids[b, :n])
            np.testing.assert_allclose(got.logp_model_BxR[b, :n], logp[b, :n], atol=1e-4)
    # The ended episode sat turn 1 out: no reply, its columns unchanged.
    assert turns[1][1] == [0, 1] and turns[1][0].lengths_B[2] == 0
    # rows x steps of the decode loops, and the steps of the rows whose reply ran
    lengths = [got.lengths_B for got, _, _ in turns]
    assert cache.slot_steps == sum(3 * (int(n.max()) - 1) for n in lengths)
    assert cache.live_steps == sum(int(np.maximum(n - 1, 0).sum()) for n in lengths)
    if settings is GREEDY:
        assert cache.end_B.tolist() == [len(OPENINGS[0]) + R + 3 + R - 1,
                                        len(OPENINGS[1]) + R + 17 + R - 1,
                                        len(OPENINGS[2]) + R - 1]


def _refill(model, settings, slots: int, steps: int, mesh=None):
    """The episodes of `_run` through `slots` slots with `advance` (chunks of `steps`): an
    episode enters a free slot, its turn 1 is fed as its turn 0 ends, and it leaves after
    turn 1 (or turn 0, with nothing to add). Its replies {(episode, turn): (ids, logp)}, the
    number of calls, and the slots each episode used."""
    graphdef, params = model
    cache = EpisodeCache(graphdef, params, settings, width=64, mesh=mesh)
    cache.start(slots)
    queue, held, got, used, calls = list(range(len(OPENINGS))), {}, {}, {}, 0
    feeds = {}
    for s in range(slots):
        b = queue.pop(0)
        held[s], feeds[s] = (b, 0), Feed(tuple(OPENINGS[b]), row=b, turn=0, fresh=True)
    while held:
        ended = cache.advance(feeds, jax.random.key(3), steps)
        calls, feeds = calls + 1, {}
        for s, (ids, _, logp_model) in ended.items():
            b, t = held.pop(s)
            got[b, t] = (ids, logp_model)
            used.setdefault(b, set()).add(s)
            if t == 0 and MESSAGES[b]:
                held[s] = (b, 1)
                feeds[s] = Feed((int(ids[-1]), *MESSAGES[b]), row=b, turn=1)
            elif queue:
                nxt = queue.pop(0)
                held[s] = (nxt, 0)
                feeds[s] = Feed(tuple(OPENINGS[nxt]), row=nxt, turn=0, fresh=True)
    assert cache.live_steps == sum(len(ids) - 1 for ids, _ in got.values())
    assert cache.live_steps < cache.slot_steps  # a slot sat steps out (waiting or empty)
    return got, calls, used


@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_episodes_through_refilled_slots_reply_as_in_turns(model, settings):
    """Per-episode scheduling (`advance`): three episodes through two slots, each turn begun
    as the episode's last one ended, decoded 2 steps a call; the third episode takes the
    slot of the first to end, from column 0. Every reply and log-prob is the one the
    episode gets when all turn together (draws keyed by its row and turn)."""
    _, turns = _run(model, settings)
    got, calls, used = _refill(model, settings, slots=2, steps=2)
    assert calls > 2 * R // 2  # replies ran over several calls
    assert len(used[2]) == 1 and used[2] <= used[0] | used[1]
    for t, (want, live, _) in enumerate(turns):
        for b in live:
            n = int(want.lengths_B[b])
            ids, logp = got[b, t]
            np.testing.assert_array_equal(ids, want.ids_BxR[b, :n])
            np.testing.assert_allclose(logp, want.logp_model_BxR[b, :n], atol=1e-5)
    assert set(got) == {(b, t) for t, (_, live, _) in enumerate(turns) for b in live}


def test_refilled_slots_split_over_a_mesh_reply_alike(model):
    mesh = Mesh(np.array(jax.devices()[:2]), ("replica",))
    one = _refill(model, SAMPLED, slots=2, steps=3)[0]
    split = _refill(model, SAMPLED, slots=2, steps=3, mesh=mesh)[0]
    assert one.keys() == split.keys()
    for k, (ids, _) in one.items():
        np.testing.assert_array_equal(ids, split[k][0])


def test_a_running_slot_cannot_be_fed(model):
    graphdef, params = model
    cache = EpisodeCache(graphdef, params, GREEDY, width=64)
    cache.start(1)
    assert cache.advance({0: Feed((5, 6), row=0, turn=0, fresh=True)}, jax.random.key(0),
                         1) == {}
    with pytest.raises(ValueError, match="slot 0 cannot take tokens"):
        cache.advance({0: Feed((5,), row=0, turn=1)}, jax.random.key(0), 1)


def test_rows_split_over_a_mesh_give_the_same_replies(model):
    """Three episodes over 2 devices: a fourth row sits every turn out."""
    mesh = Mesh(np.array(jax.devices()[:2]), ("replica",))
    one = _run(model, SAMPLED)[1]
    split = _run(model, SAMPLED, mesh)[1]
    for (a, _, _), (b, _, _) in zip(one, split, strict=True):
        np.testing.assert_array_equal(a.ids_BxR, b.ids_BxR)
        np.testing.assert_array_equal(a.lengths_B, b.lengths_B)


def test_a_row_that_would_not_fit_is_refused(model):
    graphdef, params = model
    cache = EpisodeCache(graphdef, params, GREEDY, width=12)
    cache.start(1)
    with pytest.raises(ValueError, match="episode 0: 0 \\+ 9 tokens and a reply of 5"):
        cache.turn([list(range(1, 10))], jax.random.key(0))


def test_piece_width_fits_every_row_with_tokens_left():
    # The longest remainder (17) asks 32 columns; the row at 40 of 64 has 24: 16.
    assert piece_width(np.array([3, 17, 0]), np.array([40, 10, 63]), 64) == 16
    assert piece_width(np.array([3, 17, 0]), np.array([4, 10, 63]), 64) == 32
    assert piece_width(np.array([1, 0]), np.array([0, 0]), 64) == 1

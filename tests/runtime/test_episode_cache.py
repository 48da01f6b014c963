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
from locojax.rollout import episodes
from locojax.rollout.engine import generate, pad_prompts
from locojax.rollout.episodes import EpisodeCache, Feed, extend_shapes, piece_rows, piece_width
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


def _full(model, transcripts, settings, key, length: int = 48):
    """The slot engine on each whole transcript, row b at row b, left-padded to `length`
    columns (one compiled program a setting): ids, log-probs, lengths."""
    r = generate(model, pad_prompts(transcripts, length=length), settings, key)
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


def test_piece_width_fits_every_row_the_piece_writes():
    # The longest remainder (17) asks 32 columns; the row at 40 of 64 has 24: 16.
    assert piece_width(np.array([3, 17, 0]), np.array([40, 10, 63]), 64) == 16
    assert piece_width(np.array([3, 17, 0]), np.array([4, 10, 63]), 64) == 32
    assert piece_width(np.array([1, 0]), np.array([0, 0]), 64) == 1
    # A piece on every row also writes the row at 63 that takes nothing: while that row is
    # still read (kept), one column. (Without `keep`, as this test once asserted for a piece
    # on every row, 16 columns clamped onto that row's columns 48-63: issue 60.)
    keep = np.array([False, False, True])
    assert piece_width(np.array([3, 17, 0]), np.array([40, 10, 63]), 64, keep) == 1
    assert piece_width(np.array([3, 17, 0]), np.array([4, 10, 30]), 64, keep) == 32


def test_a_piece_for_a_few_rows_runs_on_those_rows_alone():
    assert [piece_rows(n, 64) for n in (1, 2, 3, 8, 9, 64)] == [1, 2, 4, 8, 64, 64]
    assert piece_rows(1, 4) == 4  # too few rows to gather an eighth of them
    shapes = extend_shapes(64, 100)
    assert {r for r, _ in shapes} == {1, 2, 4, 8, 64}
    assert {q for _, q in shapes} == {1, 2, 4, 8, 16, 32, 64}


def test_the_extend_programs_of_a_refilled_run_are_the_plans(model, monkeypatch):
    """Every piece `advance` runs has one of `extend_shapes`' shapes (whatever the episodes
    feed): the programs a refilled run compiles are bounded by the caches' size."""
    seen = set()
    real = episodes._extend

    def counted(params, ids, *args, **kwargs):
        seen.add(ids.shape)
        return real(params, ids, *args, **kwargs)

    monkeypatch.setattr(episodes, "_extend", counted)
    _refill(model, SAMPLED, slots=2, steps=2)
    _near_the_end(model, SAMPLED)
    assert seen and seen <= extend_shapes(2, 64)
    assert len(extend_shapes(2, 64)) == 7


def _near_the_end(model, settings, steps: int = R, slots: int = 2, mesh=None):
    """Slot 0 takes a 54-token opening and replies (its columns then end near the cache's 64);
    slot 1 then takes a 20-token opening (a 32-column piece) while slot 0 waits; slot 0 is
    then fed its reply's last token and replies again. (cache, slot 0's columns after its
    first reply and after slot 1's piece, the replies {(slot, turn): (ids, logp_model)})."""
    graphdef, params = model
    cache = EpisodeCache(graphdef, params, settings, width=64, mesh=mesh)
    cache.start(slots)
    key = jax.random.key(3)
    got = {(0, 0): cache.advance({0: Feed(tuple(range(100, 154)), row=0, turn=0, fresh=True)},
                                 key, R)[0]}
    end = int(cache.end_B[0])
    before = [np.asarray(k[0, :, :, :end]) for k in cache._k]
    ended = cache.advance({1: Feed(tuple(range(200, 220)), row=1, turn=0, fresh=True)}, key,
                          steps)
    after = [np.asarray(k[0, :, :, :end]) for k in cache._k]
    ids0 = got[0, 0][0]
    ended.update(cache.advance({0: Feed((int(ids0[-1]),), row=0, turn=1)}, key, R))
    while cache.running.any():
        ended.update(cache.advance({}, key, R))
    got[1, 0], got[0, 1] = ended[1], ended[0]
    return cache, (before, after), {k: (v[0], v[2]) for k, v in got.items()}


@pytest.mark.parametrize(("settings", "slots", "devices"),
                         [(GREEDY, 2, 1), (SAMPLED, 2, 1), (SAMPLED, 16, 1), (SAMPLED, 16, 2)],
                         ids=["greedy", "sampled", "gathered", "gathered-mesh"])
def test_a_long_feed_beside_a_slot_near_its_end_leaves_that_slot_alone(model, settings, slots,
                                                                       devices):
    """A piece wider than a waiting slot's room (20 tokens: 32 columns, beside a slot at
    column ~58 of 64) writes no column of that slot, on every row (2 slots) or on the fed
    row alone (1 of 16, gathered): the waiting slot's cache is unchanged and its next reply
    and log-probs are those of a full prefill of its transcript (the slot engine)."""
    mesh = Mesh(np.array(jax.devices()[:devices]), ("replica",)) if devices > 1 else None
    cache, (before, after), got = _near_the_end(model, settings, 1, slots, mesh)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    opening0, opening1 = list(range(100, 154)), list(range(200, 220))
    reply0 = got[0, 0][0].tolist()
    for turn, transcripts, rows in ((0, [opening0, opening1], (0, 1)),
                                    (1, [opening0 + reply0, opening1], (0,))):
        ids, logp, lengths = _full(model, transcripts, settings, _key(turn), length=64)
        for b in rows:
            n = int(lengths[b])
            np.testing.assert_array_equal(got[b, turn][0], ids[b, :n])
            np.testing.assert_allclose(got[b, turn][1], logp[b, :n], atol=1e-5)

"""Multi-turn transcripts (`runtime.turns`) with the real Qwen3 tokenizer and chat template, a
real environment in worker processes, and a scripted generation in place of the model: what
enters the train rows (the model's tokens masked in, the environment's out, each reply's
log-probs at its columns), the limits, and that environment tokens get no gradient."""

from dataclasses import fields

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiler_cases import make_config

from compiler import compile_plan
from compiler.vocab import LossAggregation
from locojax.config.compose import compose_config
from locojax.envs.runner import EnvRunner, EnvSpec
from locojax.runtime.components import build_host
from locojax.runtime.episode import episode_caches
from locojax.runtime.groups import GroupPool
from locojax.runtime.hostwork import Completions, HostWork, train_rows
from locojax.runtime.observe.stats import HostStats, reward_fields
from locojax.runtime.turns import (
    TurnFormat,
    TurnLimits,
    run_episodes,
    run_refilled,
    waves_of,
)
from locojax.runtime.weights import initial_params
from locojax.tokenizers.qwen import load_qwen3
from locojax.train.loss import grpo_loss
from locojax.train.settings import GrpoSettings

ENV = '''
class Echo:
    """Answers every reply with "again"; done on a reply holding "stop"."""

    def __init__(self, row):
        self.row = row

    def step(self, reply):
        if "stop" in reply:
            return [], 1.0, True
        return [{"role": "user", "content": "again"}], 0.5, False
'''
GATED = '''
import os
import time

class Gated:
    """Echo's answers, each step only once the row's flag file exists (at most 60 s; after
    that its reward says it was not there)."""

    def __init__(self, row):
        self.flag = row["flag"]

    def step(self, reply):
        end = time.monotonic() + 60
        while not os.path.exists(self.flag) and time.monotonic() < end:
            time.sleep(0.01)
        if not os.path.exists(self.flag):
            return [], -9.0, True
        if "stop" in reply:
            return [], 1.0, True
        return [{"role": "user", "content": "again"}], 0.5, False
'''
TOK = load_qwen3()
END = TOK.token_id("<|im_end|>")
R = 6


def _limits(episode: int = 64, turns: int = 3) -> TurnLimits:
    return TurnLimits(prompt=24, episode=episode, reply=R, turns=turns, stop_ids=(END,),
                      pad_id=TOK.pad_id)


def _scripted(replies: list[list[str]], per_wave: int = 0):
    """A generation whose episode b (row i of wave w: b = w * per_wave + i) answers turn t
    with replies[b][t] (+ <|im_end|>, unless the text is cut at R tokens); log-probs
    -1 - t/10 so each turn's columns can be told apart."""
    def generate(prompts, turn: int, wave: int) -> Completions:
        b, w = prompts.ids_BxP.shape
        first = wave * per_wave
        tokens = np.zeros((b, w + R), np.int32)
        tokens[:, :w] = prompts.ids_BxP
        mask, lengths = np.zeros((b, R), bool), np.zeros(b, np.int32)
        for i in range(b):
            script = replies[first + i]
            ids = (TOK.encode(script[min(turn, len(script) - 1)]) + [END])[:R]
            tokens[i, w:w + len(ids)], mask[i, :len(ids)], lengths[i] = ids, True, len(ids)
        logp = np.full((b, R), -1.0 - turn / 10, np.float32)
        return Completions(tokens, mask, logp, logp, lengths, prompts.len_B)
    return generate


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    path = tmp_path_factory.mktemp("env") / "echo.py"
    path.write_text(ENV)
    r = EnvRunner(EnvSpec(env=f"{path}:Echo", tools=(), step_timeout_s=5, tool_timeout_s=5,
                          workers=1))
    r.check()
    yield r
    r.close()


def _rows(n: int) -> list[dict]:
    return [{"prompt": "Say stop.", "question": "Say stop.", "answer": "1"} for _ in range(n)]


def test_a_transcript_masks_in_the_replies_and_out_the_environment(runner):
    fmt = TurnFormat(TOK, chat=True, thinking=False)
    eps = run_episodes(_rows(2), runner, fmt, _limits(),
                       _scripted([["go", "stop"], ["go", "go", "go"]]), group=2)
    assert eps.turns_B.tolist() == [2, 3] and eps.last_texts == ["stop", "go"]
    assert eps.truncated_B.tolist() == [False, True]  # max_turns without done
    assert eps.env_rewards_B.tolist() == pytest.approx([0.5 + 1.0, 0.5 * 3])
    c = eps.completions
    for i, text in enumerate(["go", "go"]):  # the first reply starts the transcript
        ids = TOK.encode(text) + [END]
        assert c.tokens_BxL[i, 24:24 + len(ids)].tolist() == ids
        assert c.mask_BxT[i, :len(ids)].all()
    # the environment's answer follows in the chat template's form, masked out
    answer = TOK.encode("\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
                        "<think>\n\n</think>\n\n")
    n0 = len(TOK.encode("go")) + 1
    assert c.tokens_BxL[0, 24 + n0:24 + n0 + len(answer)].tolist() == answer
    assert not c.mask_BxT[0, n0:n0 + len(answer)].any()
    # episode 0: reply, answer, reply; every model token has its turn's log-prob
    assert int(c.lengths_B[0]) == 2 * n0 + len(answer) and c.mask_BxT[0].sum() == 2 * n0
    assert np.allclose(c.logp_model_BxT[0][c.mask_BxT[0]], [-1.0] * n0 + [-1.1] * n0)
    assert (c.logp_model_BxT[~c.mask_BxT] == 0).all()
    text = TOK.decode(c.tokens_BxL[0, 24 - c.prompt_len_B[0]:24 + c.lengths_B[0]].tolist(),
                      skip_special=False)
    assert text.startswith("<|im_start|>user\nSay stop.<|im_end|>\n<|im_start|>assistant\n")
    assert [m["role"] for m in eps.messages[0]] == ["user", "assistant", "user", "assistant"]


def test_waves_run_one_after_another_to_the_same_transcripts(runner):
    """Two waves of one episode give the transcripts of one wave of two; each turn feeds an
    episode only what it gained (turn 0 its prompt, then its reply's last token onwards)."""
    fmt = TurnFormat(TOK, chat=True, thinking=False)
    script = [["go", "stop"], ["go", "go", "go"]]
    one = run_episodes(_rows(2), runner, fmt, _limits(), _scripted(script), group=2)
    fed = []

    def recording(prompts, turn, wave):
        fed.append((wave, turn, prompts.len_B.tolist()))
        return _scripted(script, per_wave=1)(prompts, turn, wave)

    two = run_episodes(_rows(2), runner, fmt, _limits(), recording, group=2,
                       waves=waves_of([2], 1))
    for name in ("tokens_BxL", "mask_BxT", "logp_model_BxT", "lengths_B"):
        np.testing.assert_array_equal(getattr(one.completions, name),
                                      getattr(two.completions, name))
    assert two.turns_B.tolist() == [2, 3] and two.env_rewards_B.tolist() == [1.5, 1.5]
    answer = len(TOK.encode("\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
                            "<think>\n\n</think>\n\n"))
    prompt = int(one.completions.prompt_len_B[0])
    assert fed == [(0, 0, [prompt]), (0, 1, [1 + answer]), (1, 0, [prompt]),
                   (1, 1, [1 + answer]), (1, 2, [1 + answer])]


def test_two_waves_in_flight_generate_one_while_the_others_environments_run(runner, tmp_path):
    """`in_flight=2` (`sampling.env_overlap`): wave 1 generates its turn while wave 0's
    environment steps run. Wave 0's first step waits for a file only wave 1's generation
    writes, so it answers (reward 0.5, not -9) only if the two ran at the same time; the
    transcripts are those of one wave at a time."""
    env = tmp_path / "gated.py"
    env.write_text(GATED)
    gated = EnvRunner(EnvSpec(env=f"{env}:Gated", tools=(), step_timeout_s=120,
                              tool_timeout_s=5, workers=1))
    fmt = TurnFormat(TOK, chat=True, thinking=False)
    script = [["go", "stop"], ["go", "go", "go"]]
    one = run_episodes(_rows(2), runner, fmt, _limits(), _scripted(script), group=2)
    flag, fed = tmp_path / "wave1", []

    def recording(prompts, turn, wave):
        fed.append((wave, turn))
        if wave == 1:
            flag.touch()
        return _scripted(script, per_wave=1)(prompts, turn, wave)

    rows = [dict(r, flag=str(flag)) for r in _rows(2)]
    try:
        two = run_episodes(rows, gated, fmt, _limits(), recording, group=2,
                           waves=waves_of([2], 1), in_flight=2)
    finally:
        gated.close()
    assert fed == [(0, 0), (1, 0), (0, 1), (1, 1), (1, 2)]  # the lanes alternate
    assert two.env_rewards_B.tolist() == [1.5, 1.5] and two.env_errors == 0
    for name in ("tokens_BxL", "mask_BxT", "logp_model_BxT", "lengths_B"):
        np.testing.assert_array_equal(getattr(one.completions, name),
                                      getattr(two.completions, name))
    assert two.turns_B.tolist() == [2, 3] and two.truncated_B.tolist() == [False, True]


def _scripted_slots(replies: list[list[str]], calls: list[int], fed: list | None = None,
                    hook=None):
    """`Advance` in slots answering as `_scripted` does (episode b's turn t: replies[b][t]),
    episode b's every reply taking `calls[b]` calls to end. `fed` records each call's
    (slot, episode row, turn, fresh) feeds; `hook(feeds, running slots)` runs first."""
    left: dict[int, list] = {}

    def advance(feeds, running):
        if hook is not None:
            hook(feeds, set(running) | set(feeds))
        for slot, f in feeds.items():
            assert slot not in running and f.ids
            left[slot] = [f.row, f.turn, calls[f.row]]
            if fed is not None:
                fed.append((slot, f.row, f.turn, f.fresh))
        ended = {}
        for slot, state in list(left.items()):
            state[2] -= 1
            if state[2] == 0:
                b, t, _ = left.pop(slot)
                script = replies[b]
                ids = np.array((TOK.encode(script[min(t, len(script) - 1)]) + [END])[:R])
                logp = np.full(len(ids), -1.0 - t / 10, np.float32)
                ended[slot] = (ids, logp, logp)
        return ended
    return advance


def test_refilled_slots_give_the_waves_transcripts(runner):
    """Per-episode scheduling (`run_refilled`): three episodes through two slots give the
    transcripts of one wave of all three; the third takes the slot of the first to end,
    fresh, and each episode's turns are fed as its last was answered."""
    fmt = TurnFormat(TOK, chat=True, thinking=False)
    script = [["go", "stop"], ["go", "go", "go"], ["stop"]]
    one = run_episodes(_rows(3), runner, fmt, _limits(), _scripted(script), group=1)
    fed = []
    two = run_refilled(_rows(3), runner, fmt, _limits(), _scripted_slots(script, [1, 3, 1], fed),
                       group=1, counts=[3], slots=2)
    for name in ("tokens_BxL", "mask_BxT", "logp_model_BxT", "lengths_B"):
        np.testing.assert_array_equal(getattr(one.completions, name),
                                      getattr(two.completions, name))
    assert two.turns_B.tolist() == [2, 3, 1] and two.env_rewards_B.tolist() == [1.5, 1.5, 1.0]
    assert two.truncated_B.tolist() == [False, True, False]
    assert fed[:2] == [(0, 0, 0, True), (1, 1, 0, True)]
    assert (0, 2, 0, True) in fed  # episode 2 in episode 0's slot, after it ended
    assert [f for f in fed if f[1] == 1] == [(1, 1, t, t == 0) for t in range(3)]


def test_refilled_slots_decode_while_an_episode_waits_for_its_environment(tmp_path):
    """Episode 0's first environment step waits for a file that is written only when a call
    finds episode 1's reply running while episode 0 has no reply running: it answers
    (reward 0.5, not -9) only because the other slot decoded meanwhile."""
    env = tmp_path / "gated.py"
    env.write_text(GATED)
    gated = EnvRunner(EnvSpec(env=f"{env}:Gated", tools=(), step_timeout_s=120,
                              tool_timeout_s=5, workers=1))
    fmt = TurnFormat(TOK, chat=True, thinking=False)
    flag = tmp_path / "decoded"

    def hook(feeds, busy):
        if 1 in busy and 0 not in busy:
            flag.touch()

    rows = [dict(r, flag=str(flag)) for r in _rows(2)]
    try:
        eps = run_refilled(rows, gated, fmt, _limits(),
                           _scripted_slots([["go", "stop"], ["stop"]], [1, 60], hook=hook),
                           group=1, counts=[2], slots=2)
    finally:
        gated.close()
    assert eps.env_rewards_B.tolist() == [1.5, 1.0] and eps.env_errors == 0
    assert eps.turns_B.tolist() == [2, 1]


def test_waves_of_take_each_hosts_episodes_in_turn():
    assert waves_of([4], 2) == [[0, 1], [2, 3]]
    assert waves_of([3, 2], 2) == [[0, 1, 3, 4], [2]]
    assert waves_of([0, 2], 4) == [[0, 1]]


def test_a_cut_reply_is_closed_and_answered_and_the_episode_length_is_a_limit(runner):
    fmt = TurnFormat(TOK, chat=True, thinking=False)
    long = " ".join(["word"] * 20)  # past R: cut, closed with <|im_end|> (not the model's)
    eps = run_episodes(_rows(2), runner, fmt, _limits(), _scripted([[long, "stop"]] * 2),
                       group=2)
    c = eps.completions
    assert eps.turns_B.tolist() == [2, 2] and not eps.truncated_B.any()
    assert c.tokens_BxL[0, 24 + R] == END and not c.mask_BxT[0, R]
    # E = 10 tokens: the first answer does not fit, the episode ends there, truncated
    short = run_episodes(_rows(2), runner, fmt, _limits(episode=10),
                         _scripted([["go", "stop"]] * 2), group=2)
    assert short.turns_B.tolist() == [1, 1] and short.truncated_B.all()
    assert (short.completions.lengths_B <= 10).all()


def test_environment_tokens_get_no_gradient(runner):
    fmt = TurnFormat(TOK, chat=True, thinking=False)
    eps = run_episodes(_rows(2), runner, fmt, _limits(),
                       _scripted([["go", "stop"], ["go", "go", "go"]]), group=2)
    rows = train_rows(eps.completions, np.array([1.0, -1.0], np.float32))
    t = eps.completions.mask_BxT.shape[1]
    mask_BxT = jnp.asarray(rows["loss_mask_BxL"][:, -t:])
    old_BxT = jnp.asarray(rows["behaviour_logp_BxL"][:, -t:])
    settings = GrpoSettings(clip_eps=0.2, kl_coef=0.0, max_response_len=t,
                            aggregation=LossAggregation.token_mean)

    def loss(logp_BxT):
        return grpo_loss(logp_BxT, mask_BxT, jnp.asarray(rows["advantages_B"]), old_BxT,
                         settings)[0]

    grad = np.asarray(jax.grad(loss)(old_BxT + 0.01))
    env = rows["valid_BxL"][:, -t:] & ~rows["loss_mask_BxL"][:, -t:]
    assert env.sum() > 10 and (grad[env] == 0).all()
    assert (np.abs(grad[np.asarray(mask_BxT)]) > 0).all()


def test_the_devices_idle_share_is_the_wait_between_generations(runner):
    """`env_wait_s`: the seconds between a batch's generations (the environments' turns and
    the transcripts' bookkeeping); a row's `device_idle_frac` is the most-waiting host's
    share of its rollout, wait / (wait + generation)."""
    fmt = TurnFormat(TOK, chat=True, thinking=False)
    eps = run_episodes(_rows(2), runner, fmt, _limits(), _scripted([["go", "stop"]] * 2),
                       group=2)
    assert eps.env_wait_s > 0 and eps.rollout_s > 0
    ones = {f.name: 1.0 for f in fields(HostStats) if f.name != "fn_stats"}
    hosts = [HostStats(**ones | {"rollout_s": 3.0, "env_wait_s": 1.0}),
             HostStats(**ones | {"rollout_s": 2.0, "env_wait_s": 2.0})]
    row = reward_fields(0, np.stack([h.as_array() for h in hosts]))
    assert row["env_wait_s"] == 2.0 and row["device_idle_frac"] == pytest.approx(0.5)


def test_two_waves_in_flight_read_one_copy_of_the_weights():
    """`episode_caches`: one cache per wave in flight, every one reading the weights the first
    placed on the rollout mesh; weights not yet there are placed once, not once a cache."""
    plan = compile_plan(compose_config(["+experiment=arith_tools_co", "mesh=cpu",
                                        "mesh.devices_per_host=8",
                                        "sampling.env_overlap=true",
                                        "sampling.schedule=static"]))
    host = build_host(plan, 0)
    try:
        params = jax.tree.map(np.asarray, initial_params(host))  # on no device mesh
        caches = episode_caches(host, params, host.sampling)
        first, second = (jax.tree.leaves(c.params) for c in caches)
        assert len(caches) == plan.batch.waves_in_flight == 2
        assert all(a is b for a, b in zip(first, second, strict=True))
    finally:
        host.close()


def test_dynamic_sampling_keeps_whole_transcripts_with_their_masks(runner):
    """`algorithm.dynamic_sampling=filter` on multi-turn rows: a zero-std group of episodes is
    dropped for the next batch's informative one, whose rows are its transcripts as sampled
    (environment tokens still out of the loss)."""
    fmt = TurnFormat(TOK, chat=True, thinking=False)
    plan = compile_plan(make_config(overrides={"workload": {"group_size": 2}}))
    work = HostWork(plan, tokenizer=None, scorer=None)  # rows() reads the plan alone
    same = run_episodes(_rows(2), runner, fmt, _limits(), _scripted([["go", "stop"]] * 2),
                        group=2)
    mixed = run_episodes(_rows(2), runner, fmt, _limits(),
                         _scripted([["go", "stop"], ["go", "go", "go"]]), group=2)
    pool = GroupPool(1, 2, filtering=True, max_batches=3)
    pool.add(same.completions, np.array([1.0, 1.0], np.float32), rollout_s=1.0)
    assert pool.wanting
    pool.add(mixed.completions, np.array([1.0, -1.0], np.float32), rollout_s=1.0)
    assert not pool.wanting
    rows, counts = pool.rows(work)
    assert (counts.sampled, counts.zero_std, counts.batches) == (2, 1, 2)
    assert (rows["tokens_BxL"] == mixed.completions.tokens_BxL).all()
    alone = train_rows(mixed.completions, np.array([1.0, -1.0], np.float32))
    assert (rows["loss_mask_BxL"] == alone["loss_mask_BxL"]).all()
    env = rows["valid_BxL"] & ~rows["loss_mask_BxL"]
    assert env[:, mixed.completions.prompt_width:].sum() > 10  # the environment's turns
    assert (rows["advantages_B"] != 0).all()


def test_each_episode_goes_on_as_soon_as_its_own_environment_answered(tmp_path):
    """Two environment workers: episode 0's first step waits for a file written only when
    episode 1's second turn is fed, so both get their rewards (not -9) only because episode
    1's answer was taken on its own, while episode 0's step was still running."""
    env = tmp_path / "gated.py"
    env.write_text(GATED)
    gated = EnvRunner(EnvSpec(env=f"{env}:Gated", tools=(), step_timeout_s=120,
                              tool_timeout_s=5, workers=2))
    fmt = TurnFormat(TOK, chat=True, thinking=False)
    flag, ready = tmp_path / "second_turn", tmp_path / "ready"
    ready.touch()

    def hook(feeds, busy):
        if any(f.row == 1 and f.turn == 1 for f in feeds.values()):
            flag.touch()

    rows = [dict(r, flag=str(f)) for r, f in zip(_rows(2), (flag, ready), strict=True)]
    try:
        eps = run_refilled(rows, gated, fmt, _limits(),
                           _scripted_slots([["go", "stop"]] * 2, [1, 1], hook=hook),
                           group=1, counts=[2], slots=2)
    finally:
        gated.close()
    assert eps.env_rewards_B.tolist() == [1.5, 1.5] and eps.env_errors == 0


def test_a_quorum_of_one_waits_for_every_answer(runner):
    """`sampling.decode_quorum=1`: with no reply running, a call waits until every episode
    in a slot is ready, so the episodes' turns are fed together (turn by turn); 0 feeds
    each as it comes. The transcripts are the same."""
    fmt = TurnFormat(TOK, chat=True, thinking=False)
    script = [["go", "go", "stop"], ["go", "go", "stop"]]
    calls = {}
    for quorum in (0.0, 1.0):
        fed = []
        calls[quorum] = fed

        def hook(feeds, busy, fed=fed):
            fed.append(sorted((f.row, f.turn) for f in feeds.values()))

        eps = run_refilled(_rows(2), runner, fmt, _limits(),
                           _scripted_slots(script, [1, 1], hook=hook), group=1, counts=[2],
                           slots=2, quorum=quorum)
        assert eps.turns_B.tolist() == [3, 3] and eps.env_rewards_B.tolist() == [2.0, 2.0]
    assert calls[1.0] == [[(0, t), (1, t)] for t in range(3)]
    assert len(calls[0.0]) >= 3

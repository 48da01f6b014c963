"""Multi-turn episodes on the host that sampled: the model's turns on the devices, the
environment's and the tools' turns in worker processes beside them (`envs.runner`).

    problems (P) x G ──EnvRunner.open: Class(row) per episode, reset()──> opening messages
        ──TurnFormat.opening (chat template with the tools block | plain turns)──> prompt ids
    for turn in [0, max_turns) while an episode is open:
        each open episode's new tokens (turn 0: its prompt; then its reply's last token, the
            environment's messages and the next generation prompt), left-padded; an ended
            episode's none ──generate (the mode's: this host's `EpisodeCache` on a CO host
            or DA actor, the workers' through the driver for the single controller; the
            episode's KV cache kept across its turns), one row per episode, the turn's
            key──> replies (<= R tokens)
        reply ids and log-probs ──> transcript, loss mask on (the model's tokens)
        reply text ──EnvRunner.step (tool calls run | env.step)──> messages, reward, done
        messages ──TurnFormat.after_reply──> transcript, loss mask off
        a reply cut at R tokens is closed with the turn's end token (masked) and answered;
        an episode ends: done; past E (truncated); max_turns (truncated when not done)
    (`sampling.schedule=static`, `run_episodes`: one wave of episodes at a time, or two
        (`sampling.env_overlap`): one wave's turn generates while the other's environment
        steps run on a step thread)
    (`refill`, `run_refilled`: per episode, through the host's slots: each call of the
        mode's `Advance` feeds the slots whose environments answered (a fresh slot: its
        next episode's prompt) and decodes every running reply for a chunk of steps; the
        replies that ended go to the step thread at once; an ended episode's slot takes the
        next episode)
    ──> Episodes: the whole transcripts as `Completions` (T = E: the train rows of
        `hostwork.train_rows` unchanged, every token of an episode with its group's
        advantage), the last replies' texts (scored with the transcript as `messages`),
        the step rewards, the turn counts
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

import jax
import numpy as np

from compiler.passes.lengths import cache_len, multi_turn, reply_len
from compiler.plan import ExecutionPlan
from compiler.vocab import Overlong, RolloutSchedule
from locojax.data import Problem, render_prompt
from locojax.envs.call_formats import FORMATS, ToolFormat, merged, tool_format_of, tools_message
from locojax.envs.runner import EnvRunner, EnvSpec
from locojax.envs.turns import render_plain
from locojax.episodes.keys import turn_key
from locojax.rollout.episodes import EpisodeCache, Feed
from locojax.rollout.sampler import SamplingSettings
from locojax.runtime.errors import UserError
from locojax.runtime.hostwork import Completions, Prompts
from locojax.tokenizers import Tokenizer, apply_chat_template
from locojax.tokenizers.continuation import TemplateTurns

Generate = Callable[[Prompts, int, int], Completions]
"""A turn's generation: the new tokens since its last turn of every episode of a wave (one
row each, left-padded; length 0: the episode ended), the turn's index and the wave's -> the
replies after those tokens, the generation keeping the wave's transcripts from its turn 0 on
(the key of turn t is `jax.random.fold_in(<the batch's key>, t)`, each row's draws keyed by
its index among the host's episodes, in every mode)."""


@dataclass(frozen=True)
class TurnFormat:
    """How messages become token ids: the tokenizer's chat template (its checkpoint's own, else
    Qwen3's) with the tools block, or the plain turn format (`envs.turns`) for a tokenizer
    without a chat template. A turn continues (`after_reply`, `turn_end`) in the opening's
    template: Qwen3's written in Python, a checkpoint's own found by rendering it
    (`tokenizers.continuation`)."""

    tokenizer: Tokenizer
    chat: bool
    thinking: bool
    tools: tuple[dict, ...] = ()
    calls: ToolFormat = ToolFormat.qwen
    """How the model calls the tools (`envs.call_formats`, `call_format`)."""

    @property
    def _plain_tools(self) -> bool:
        return self.chat and bool(self.tools) and FORMATS[self.calls].describes_tools

    def opening_text(self, messages: Sequence[dict]) -> str:
        """The prompt's text: the opening messages and the generation prompt (the `plain` call
        format: after a system message describing the tools)."""
        if self._plain_tools:
            messages = [{"role": "system", "content": tools_message(self.tools)}, *messages]
            return self.tokenizer.chat(list(messages), enable_thinking=self.thinking)
        if self.chat:
            return self.tokenizer.chat(list(messages), enable_thinking=self.thinking,
                                       tools=list(self.tools) or None)
        return render_plain(list(messages), list(self.tools) or None)

    def opening(self, messages: Sequence[dict]) -> list[int]:
        """The prompt: the opening messages and the generation prompt. UserError (one line)
        when the chat template refuses them or a message holds a character the tokenizer
        cannot encode."""
        return _encoded(self.tokenizer, lambda: self.opening_text(messages),
                        "an opening message", prompt=True)

    @functools.cached_property
    def own(self) -> TemplateTurns | None:
        """The turns of the tokenizer's own (Jinja) chat template; None for Qwen3's (written
        in Python below) and for the plain format. Raises ValueError (one line) for a
        template whose transcript cannot be continued (`tokenizers.continuation`)."""
        template = self.tokenizer.chat_template
        if not self.chat or template is None or template.jinja is None:
            return None
        tools = () if self._plain_tools else self.tools
        return TemplateTurns.of(self.tokenizer, self.thinking, tools)

    def turn_end(self) -> list[int]:
        """The token that ends the model's turn (Qwen3: `<|im_end|>`; a checkpoint's own
        template: the one it ends a reply with; plain: end of text), written after a reply cut
        at its length."""
        tok = self.tokenizer
        if self.own is not None:
            return [self.own.end_id]
        return [tok.token_id("<|im_end|>") if self.chat else tok.eos_id]

    def after_text(self, messages: Sequence[dict]) -> str:
        """The text of `after_reply`."""
        if self.chat and FORMATS[self.calls].merged:
            messages = merged(messages)
        if self.own is not None:
            return self.own.continuation(list(messages))
        if self.chat:
            return "\n" + apply_chat_template(list(messages), enable_thinking=self.thinking)
        return "\n" + render_plain(list(messages))

    def after_reply(self, messages: Sequence[dict]) -> list[int]:
        """What follows a reply that ended on its stop token: the environment's messages and
        the next generation prompt (merged into one user message where the call format asks,
        `CallFormat.merged`). UserError (one line) when a message holds a character the
        tokenizer cannot encode."""
        return _encoded(self.tokenizer, lambda: self.after_text(messages),
                        "a message of the environment or a tool")


def _encoded(tokenizer: Tokenizer, text: Callable[[], str], what: str,
             prompt: bool = False) -> list[int]:
    """The ids of `text()` (`prompt`: as a prompt, behind its start token); UserError naming
    `what` when the chat template refuses it (a bound, `raise_exception`) or the tokenizer
    cannot encode a character of it."""
    try:
        rendered = text()
        return tokenizer.encode_prompts([rendered])[0] if prompt else tokenizer.encode(rendered)
    except ValueError as err:
        raise UserError(f"{what}: {err}") from None


TURN_FIX = "model.tokenizer=ascii model.vocab=100"
"""The built-in tokenizer that writes the plain turn format (letters, digits, punctuation)."""


def check_turn_alphabet(fmt: TurnFormat, tokenizer_key: str) -> None:
    """UserError (one line naming the fix) when the tokenizer cannot encode the turn format's
    own text (`Assistant: `, `User: `, the tools' lines: the char model's alphabet has no
    such letters), checked at start-up on empty messages of every role an episode writes."""
    texts = [fmt.opening_text([{"role": "user", "content": ""}]),
             fmt.after_text([{"role": "tool", "content": ""}, {"role": "user", "content": ""}])]
    odd = sorted({c for _, chars in fmt.tokenizer.unknown_characters(texts) for c in chars})
    if odd:
        raise UserError(f"{tokenizer_key}: cannot write the turn format of workload.env or "
                        f"workload.tools (it cannot encode {odd[:12]!r}); use {TURN_FIX}, or a "
                        "tokenizer with a chat template")


@dataclass(frozen=True)
class OverlongRule:
    """What an episode cut by a limit trains on (`algorithm.overlong`)."""

    masks: bool
    """Zero loss weight."""
    penalises: bool
    """DAPO's soft overlong punishment added to its reward (`overlong_penalty`)."""


OVERLONG = {Overlong.keep: OverlongRule(False, False), Overlong.mask: OverlongRule(True, False),
            Overlong.penalty: OverlongRule(False, True)}


def overlong_penalty(length: int, limit: int, buffer: int, cut: bool) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13) of an episode of `length`
    tokens out of `limit`: 0 up to limit - buffer, then (limit - buffer - length) / buffer,
    and -1 for an episode a limit cut (or past `limit`)."""
    if cut or length > limit:
        return -1.0
    start = limit - buffer
    return 0.0 if length <= start else (start - length) / buffer


@dataclass(frozen=True)
class TurnLimits:
    """The plan's limits on an episode, and what an episode they cut, or one an environment
    failure ended, trains on."""

    prompt: int
    """P: tokens of the opening (cut on the left, as single-turn prompts)."""
    episode: int
    """E: tokens after the opening (replies and environment messages)."""
    reply: int
    """R: tokens of one reply."""
    turns: int
    """The model's turns at most."""
    stop_ids: tuple[int, ...]
    pad_id: int
    mask_failures: bool = True
    """`algorithm.mask_env_failures`: an episode an environment or worker failure ended gets
    zero loss weight."""
    overlong: Overlong = Overlong.keep
    """`algorithm.overlong` (`OVERLONG`)."""
    overlong_buffer: int = 0
    """`algorithm.overlong_buffer`: DAPO's L_cache."""


@dataclass
class _Episode:
    """One episode's transcript while it runs."""

    prompt: list[int]
    messages: list[dict]
    ids: list[int] = field(default_factory=list)
    model: list[bool] = field(default_factory=list)
    logp_model: list[float] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    open: bool = True
    truncated: bool = False
    turns: int = 0
    reward: float = 0.0
    last_text: str = ""
    cut_replies: int = 0
    """Replies cut at R tokens (closed with the turn's end token)."""
    failed: bool = False
    """Ended by an environment or worker failure (`TurnResult.env_error`)."""
    cached: int = 0
    """Tokens of prompt + ids the generation holds (fed to the model so far)."""

    def add(self, ids: Sequence[int], model: bool, logp_model=None, logp=None) -> None:
        n = len(ids)
        self.ids += [int(i) for i in ids]
        self.model += [model] * n
        self.logp_model += list(logp_model) if logp_model is not None else [0.0] * n
        self.logp += list(logp) if logp is not None else [0.0] * n


@dataclass(frozen=True)
class Episodes:
    """A batch of finished episodes, episode i of problem i // G."""

    completions: Completions
    """The whole transcripts: prompt (P, left-padded), then E columns of replies and
    environment messages; `mask_BxT` on the model's tokens only; `lengths_B` every token."""
    last_texts: list[str]
    """Each episode's last reply (what the reward functions score)."""
    messages: list[list[dict]]
    """Each episode's transcript as messages (the reward functions' `messages` column)."""
    env_rewards_B: np.ndarray
    """float32: the sum of each episode's step rewards."""
    turns_B: np.ndarray
    truncated_B: np.ndarray
    """bool: cut by a limit (R without a stop token, E, max_turns)."""
    tool_calls: int = 0
    tool_errors: int = 0
    env_errors: int = 0
    tool_results_cut: int = 0
    """Tool results cut to workload.max_tool_result_tokens."""
    tool_calls_dropped: int = 0
    """Tool calls past workload.max_tool_calls in a reply, not run."""
    env_s: float = 0.0
    """Host seconds in environments and tools (summed over the episodes)."""
    rollout_s: float = 0.0
    """Seconds in the turns' generations."""
    env_wait_s: float = 0.0
    """Seconds between the turns' generations: the environments' and tools' turns (the
    workers at once) and the transcripts' bookkeeping, while the devices wait."""
    slot_steps: int = 0
    """Rows x steps of the decode loops (`EpisodeCache.slot_steps`; set by the mode)."""
    live_steps: int = 0
    """Of those, the steps of rows whose reply was running."""
    prompts_cut: int = 0
    masked_failures: int = 0
    """Episodes given zero loss weight: ended by an environment or worker failure."""
    masked_overlong: int = 0
    """Episodes given zero loss weight: cut by a limit (`algorithm.overlong=mask`)."""
    penalty_B: np.ndarray | None = None
    """float32 DAPO overlong penalty of each episode (`algorithm.overlong=penalty`; None:
    none), added to its reward."""


def _turn_prompts(eps: list[_Episode], limits: TurnLimits) -> Prompts:
    """Each open episode's tokens the generation has not been fed, left-padded; none for an
    ended one."""
    new = [(e.prompt + e.ids)[e.cached:] if e.open else [] for e in eps]
    len_B = np.array([len(x) for x in new], np.int32)
    ids_BxW = np.full((len(new), max(int(len_B.max()), 1)), limits.pad_id, np.int32)
    for i, x in enumerate(new):
        ids_BxW[i, ids_BxW.shape[1] - len(x):] = x
    return Prompts(ids_BxW, len_B, 0)


def _reply_row(out: Completions, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row `i` of a turn's `Completions` as (ids, logp, logp_model) of its reply."""
    n, w = int(out.lengths_B[i]), out.prompt_width
    return out.tokens_BxL[i, w:w + n], out.logp_BxT[i, :n], out.logp_model_BxT[i, :n]


def _take_reply(e: _Episode, got: tuple[np.ndarray, np.ndarray, np.ndarray],
                limits: TurnLimits, fmt: TurnFormat) -> None:
    """Episode `e`'s reply `got` (ids, logp, logp_model), appended with its log-probs. A reply
    cut at R tokens is closed with the turn's end token (not the model's: masked out) and the
    environment still answers it; one that does not fit in E ends the episode, truncated."""
    ids, logp, logp_model = got
    n = len(ids)
    room = limits.episode - len(e.ids)
    reply = [int(x) for x in ids]
    stopped = n > 0 and reply[-1] in limits.stop_ids
    close = [] if stopped else fmt.turn_end()
    keep = min(n, room)
    e.cached = len(e.prompt) + len(e.ids) + n - 1  # the reply's last token is drawn, not fed
    e.add(reply[:keep], True, logp_model[:keep], logp[:keep])
    e.turns += 1
    e.last_text = fmt.tokenizer.decode(reply[:keep])
    e.messages.append({"role": "assistant", "content": e.last_text})
    if keep < n or len(e.ids) + len(close) > limits.episode:
        e.open, e.truncated = False, True
        return
    e.add(close, False)
    e.cut_replies += not stopped


def _take_turn(e: _Episode, result, fmt: TurnFormat, limits: TurnLimits, last: bool) -> None:
    """The environment's answer to `e`'s reply: its reward, and unless the episode ends its
    messages (cut: past E, or no turn left)."""
    e.reward += result.reward
    e.failed = e.failed or result.env_error is not None
    if result.done:
        e.open = False
        return
    more = fmt.after_reply(result.messages)
    if last or len(e.ids) + len(more) + 1 > limits.episode:
        e.open, e.truncated = False, True
        return
    e.add(more, False)
    e.messages += [dict(m) for m in result.messages]


def run_episodes(rows: list[dict], runner: EnvRunner, fmt: TurnFormat, limits: TurnLimits,
                 generate: Generate, group: int,
                 waves: Sequence[Sequence[int]] | None = None, in_flight: int = 1) -> Episodes:
    """One episode per row of `rows` (`episode_rows`: `group` adjacent rows a problem), run
    to their end; see the module's picture. `waves`: the episodes (indices) of each wave
    (None: one wave of every episode). `in_flight` waves run at once: wave w on lane
    w % in_flight, a lane's waves one after another, each to its end; while one lane's
    environments and tools run on the workers (`EnvRunner.submit`), the next lane's wave
    generates its turn. An episode's transcript does not depend on `in_flight` (its draws
    are keyed by its row and the turn)."""
    eps, cut = _open(rows, runner, fmt, limits, group)
    counts = _counts()
    numbered = list(enumerate(list(w) for w in (waves or [range(len(eps))])))
    lanes = [_Lane(numbered[k::in_flight]) for k in range(min(in_flight, len(numbered)))]
    start = time.perf_counter()
    while any(lane.waves for lane in lanes):
        for lane in lanes:
            _advance(lane, eps, runner, fmt, limits, generate, counts)
    counts["env_wait_s"] = time.perf_counter() - start - counts["rollout_s"]
    return _episodes(eps, limits, counts, cut)


def _open(rows: list[dict], runner: EnvRunner, fmt: TurnFormat, limits: TurnLimits,
          group: int) -> tuple[list[_Episode], int]:
    """Every row's episode opened (`EnvRunner.open`), its prompt cut to P on the left; and
    how many problems' prompts were cut."""
    openings = runner.open(rows)
    ids = [fmt.opening(m) for m in openings]
    eps = [_Episode(fmt.tokenizer.keep_end(x, limits.prompt), [dict(y) for y in m])
           for x, m in zip(ids, openings, strict=True)]
    return eps, sum(len(x) > limits.prompt for x in ids[::group])


def _counts() -> dict:
    return {"tool_calls": 0, "tool_errors": 0, "env_errors": 0, "tool_results_cut": 0,
            "tool_calls_dropped": 0, "env_s": 0.0, "rollout_s": 0.0, "env_wait_s": 0.0}


def _take_results(results: dict, eps: list[_Episode], fmt: TurnFormat, limits: TurnLimits,
                  counts: dict) -> None:
    """The environments' answers (episode -> `TurnResult`) taken into their episodes and
    counted; an episode's last turn is its `limits.turns`-th reply."""
    for i, r in results.items():
        counts["tool_calls"] += r.tool_calls
        counts["tool_errors"] += r.tool_errors
        counts["env_errors"] += r.env_error is not None
        counts["tool_results_cut"] += r.results_cut
        counts["tool_calls_dropped"] += r.calls_dropped
        counts["env_s"] += r.seconds
        _take_turn(eps[i], r, fmt, limits, last=eps[i].turns >= limits.turns)


Advance = Callable[[dict[int, Feed], frozenset[int]], dict[int, tuple]]
"""Per-episode scheduling's generation (`sampling.schedule=refill`): feed the slots in the
first argument (slot -> `Feed`: an episode's new tokens, its draw row and turn) and decode
every running reply (the second argument: the slots whose replies were running) for a chunk
of steps -> the replies that ended, slot -> (ids, logp, logp_model) (`EpisodeCache.advance`,
in every mode: a host's own cache, or the workers' through the single controller's driver)."""


def run_refilled(rows: list[dict], runner: EnvRunner, fmt: TurnFormat, limits: TurnLimits,
                 advance: Advance, group: int, counts: Sequence[int], slots: int,
                 quorum: float = 0.0) -> Episodes:
    """`run_episodes` with per-episode scheduling: host h's `counts[h]` episodes (the hosts'
    one after another) go through its `slots` slots (slot ids h * slots on); an episode
    takes a free slot, keeps it to its end, and each of its turns begins as soon as the
    environment answered its last; the slot then takes the host's next episode. While
    episodes wait for their environments (`EnvRunner.submit`), the others decode. Episode i
    of host h draws as row i - (its host's first) with its turn's key, so its transcript is
    the one `run_episodes` gives it. `quorum` (`sampling.decode_quorum`): with no reply
    running, a call waits until that share of the waiting and ready episodes are ready (or
    none is waiting)."""
    eps, cut = _open(rows, runner, fmt, limits, group)
    tally = _counts()
    slate = _Slots(eps, counts, slots)
    waiting: dict[int, tuple[Future, int]] = {}
    """Episode -> its environment's answer to come (`EnvRunner.submit_each`) and its slot."""
    start = time.perf_counter()
    while slate.held:
        done = [i for i, (f, _) in waiting.items() if f.done()]
        if done:
            answers = runner.settle({i: waiting[i][0].result() for i in done})
            _take_results(answers, eps, fmt, limits, tally)
            for i in sorted(done):
                slate.answered(waiting.pop(i)[1])
        ready = len(slate.feeds)
        if not (slate.running or (ready and ready >= quorum * (ready + len(waiting)))):
            if waiting:
                wait([f for f, _ in waiting.values()], return_when=FIRST_COMPLETED)
            continue
        t0 = time.perf_counter()
        ended = advance(dict(slate.feeds), frozenset(slate.running))
        tally["rollout_s"] += time.perf_counter() - t0
        slate.running |= set(slate.feeds)
        slate.feeds.clear()
        replies, slot_of = {}, {}
        for slot in sorted(ended):
            slate.running.discard(slot)
            i = slate.held[slot]
            _take_reply(eps[i], ended[slot], limits, fmt)
            if eps[i].open:
                replies[i], slot_of[i] = eps[i].last_text, slot
            else:
                slate.answered(slot)
        for i, future in runner.submit_each(replies).items():
            waiting[i] = (future, slot_of[i])
    tally["env_wait_s"] = time.perf_counter() - start - tally["rollout_s"]
    return _episodes(eps, limits, tally, cut)


class _Slots:
    """Which episode each slot holds and what it is fed next (`run_refilled`)."""

    def __init__(self, eps: list[_Episode], counts: Sequence[int], slots: int):
        self.eps, self.slots = eps, slots
        self.first = np.cumsum([0, *counts])
        self.queues = [list(range(int(a), int(b)))
                       for a, b in zip(self.first, self.first[1:], strict=False)]
        self.held: dict[int, int] = {}
        """Slot -> the episode it holds."""
        self.feeds: dict[int, Feed] = {}
        """Slot -> what it takes at the next call."""
        self.running: set[int] = set()
        """Slots whose reply is being decoded."""
        for slot in range(len(counts) * slots):
            self._next_episode(slot)

    def _row(self, slot: int) -> int:
        return self.held[slot] - int(self.first[slot // self.slots])

    def _next_episode(self, slot: int) -> None:
        """The slot's host's next episode into it, fresh (none left: the slot stays free)."""
        queue = self.queues[slot // self.slots]
        if queue:
            i = queue.pop(0)
            self.held[slot], self.eps[i].cached = i, 0
            self.feeds[slot] = Feed(tuple(self.eps[i].prompt), row=self._row(slot), turn=0,
                                    fresh=True)

    def answered(self, slot: int) -> None:
        """The slot's episode after its environment's answer (or a limit): fed what it
        gained, or, ended, replaced by the next episode."""
        e = self.eps[self.held[slot]]
        if not e.open:
            del self.held[slot]
            self._next_episode(slot)
            return
        self.feeds[slot] = Feed(tuple((e.prompt + e.ids)[e.cached:]), row=self._row(slot),
                                turn=e.turns)


@dataclass
class _Lane:
    """Waves run one after another, each to its end, at most one turn's environment steps
    pending."""

    waves: list[tuple[int, list[int]]]
    """(wave number, its episodes) left to run, the running one first."""
    turn: int = 0
    """The running wave's turn: the next to generate, or the one whose steps are pending."""
    pending: Future | None = None


def _advance(lane: _Lane, eps: list[_Episode], runner: EnvRunner, fmt: TurnFormat,
             limits: TurnLimits, generate: Generate, counts: dict) -> None:
    """One move of `lane`: its running wave's pending environment answers taken (waited for),
    then that wave's next turn generated (or the lane's next wave's first, when the running
    one has no open episode or turn left) and its replies handed to the environments."""
    if lane.pending is not None:
        results, lane.pending = lane.pending.result(), None
        _take_results(results, eps, fmt, limits, counts)
        lane.turn += 1
    while lane.waves and (lane.turn >= limits.turns
                          or not any(eps[i].open for i in lane.waves[0][1])):
        lane.waves, lane.turn = lane.waves[1:], 0
    if not lane.waves:
        return
    wave, index = lane.waves[0]
    wave_eps = [eps[i] for i in index]
    t0 = time.perf_counter()
    out = generate(_turn_prompts(wave_eps, limits), lane.turn, wave)
    counts["rollout_s"] += time.perf_counter() - t0
    live = [j for j, e in enumerate(wave_eps) if e.open]
    for j in live:
        _take_reply(wave_eps[j], _reply_row(out, j), limits, fmt)
    lane.pending = runner.submit({index[j]: wave_eps[j].last_text for j in live
                                  if wave_eps[j].open})


def waves_of(counts: Sequence[int], per_wave: int) -> list[list[int]]:
    """Waves over hosts' episodes (`counts[h]` of host h, the hosts' episodes one after
    another): wave w holds episodes [w * per_wave, (w + 1) * per_wave) of every host."""
    starts = np.cumsum([0, *counts])
    n = max(-(-c // per_wave) for c in counts) if counts else 0
    return [[int(s) + j for s, c in zip(starts, counts, strict=False)
             for j in range(w * per_wave, min((w + 1) * per_wave, c))] for w in range(n)]


def _episodes(eps: list[_Episode], limits: TurnLimits, counts: dict, cut: int) -> Episodes:
    """The finished episodes as transcripts (`Completions`) and their counts; the loss mask
    cleared on episodes a failure ended (`mask_failures`) or a limit cut (`overlong=mask`)."""
    b, p, t = len(eps), limits.prompt, limits.episode
    tokens = np.full((b, p + t), limits.pad_id, np.int32)
    mask, logp_model, logp = (np.zeros((b, t), d) for d in (bool, np.float32, np.float32))
    failed_B = np.array([e.failed and limits.mask_failures for e in eps], bool)
    rule = OVERLONG[Overlong(limits.overlong)]
    overlong_B = np.array([e.truncated and rule.masks for e in eps], bool) & ~failed_B
    for i, e in enumerate(eps):
        n = len(e.ids)
        tokens[i, p - len(e.prompt):p] = e.prompt
        tokens[i, p:p + n] = e.ids
        mask[i, :n], logp_model[i, :n], logp[i, :n] = e.model, e.logp_model, e.logp
    mask[failed_B | overlong_B] = False
    penalty = None if not rule.penalises else np.array(
        [overlong_penalty(len(e.ids), t, limits.overlong_buffer, e.truncated) for e in eps],
        np.float32)
    comp = Completions(tokens_BxL=tokens, mask_BxT=mask, logp_model_BxT=logp_model,
                       logp_BxT=logp, lengths_B=np.array([len(e.ids) for e in eps], np.int32),
                       prompt_len_B=np.array([len(e.prompt) for e in eps], np.int32))
    return Episodes(comp, [e.last_text for e in eps], [e.messages for e in eps],
                    np.array([e.reward for e in eps], np.float32),
                    np.array([e.turns for e in eps], np.int32),
                    np.array([e.truncated for e in eps], bool), prompts_cut=cut,
                    masked_failures=int(failed_B.sum()), masked_overlong=int(overlong_B.sum()),
                    penalty_B=penalty, **counts)


EVAL_STEP = -1
"""The `step` of held-out evaluation's environment seeds: every evaluation draws alike."""


def env_seed(run_seed: int, step: int, uid: str) -> int:
    """The environment seed of a problem's group at `step` (`row["seed"]`): a function of
    (run.seed, step, the problem's uid) alone, in [0, 2^63), so a group's episodes share
    their draws, in every mode and schedule, and a resumed run replays them."""
    digest = hashlib.blake2b(f"{run_seed}:{step}:{uid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def episode_rows(problems: Sequence[Problem], group: int, template: str, run_seed: int = 0,
                 step: int = EVAL_STEP) -> list[dict]:
    """Each episode's data row: every column of its problem, `question`, `answer`, the
    rendered `prompt` and the group's environment `seed` (`env_seed`; G adjacent rows per
    problem). A data column named `seed` is replaced."""
    out = []
    for p in problems:
        row = {**(p.columns or {}), "question": p.question, "answer": p.answer,
               "prompt": render_prompt(p, template), "seed": env_seed(run_seed, step, p.uid)}
        out += [dict(row) for _ in range(group)]
    return out


@dataclass(frozen=True)
class TurnSetup:
    """What a host needs to run episodes: its environment workers, the turn format and
    limits, and the sampling settings of one reply."""

    runner: EnvRunner
    fmt: TurnFormat
    limits: TurnLimits
    reply: object
    """`SamplingSettings` of one turn (max_new_tokens: R)."""
    template: str

    def close(self) -> None:
        self.runner.close()


def refilled(plan: ExecutionPlan) -> bool:
    """Whether a plan's episodes are scheduled one by one (`sampling.schedule=refill`:
    `run_refilled`) rather than in waves (`static`: `run_episodes`)."""
    return plan.sampling.schedule is RolloutSchedule.refill


def wave_rows(plan: ExecutionPlan) -> int:
    """Episodes of one host's wave: the plan's slots on each of its rollout replicas (its
    episodes over the plan's waves)."""
    b = plan.batch
    return b.prompts_per_rollout_host * b.group_size // b.rollout_waves


def episode_width(plan: ExecutionPlan) -> int:
    """Columns of an episode's KV cache (`passes.lengths.cache_len`)."""
    return cache_len(plan.workload, plan.sampling)


def cached_turn(caches: Sequence[EpisodeCache], key: jax.Array, per_wave: int,
                prompts: Prompts, turn: int, wave: int) -> Completions:
    """`Generate` on one cache per wave in flight (`partial(cached_turn, caches, key,
    per_wave)`; wave w on `caches[w % len(caches)]`, started for the wave's episodes at its
    turn 0, their draws keyed as rows `wave * per_wave` on): the replies after each
    episode's new tokens, as `Completions` after those tokens."""
    cache = caches[wave % len(caches)]
    if turn == 0:
        cache.start(len(prompts.len_B), first_row=wave * per_wave)
    w = prompts.ids_BxP.shape[1]
    new = [prompts.ids_BxP[i, w - n:].tolist() for i, n in enumerate(prompts.len_B)]
    out = cache.turn(new, turn_key(key, turn))
    t = out.ids_BxR.shape[1]
    return Completions(tokens_BxL=np.concatenate([prompts.ids_BxP, out.ids_BxR], axis=1),
                       mask_BxT=np.arange(t) < out.lengths_B[:, None],
                       logp_model_BxT=out.logp_model_BxR, logp_BxT=out.logp_BxR,
                       lengths_B=out.lengths_B, prompt_len_B=prompts.len_B)


def reply_settings(plan: ExecutionPlan, sampling: SamplingSettings) -> SamplingSettings:
    """The sampling settings of one turn: the plan's, at one reply's length."""
    return dataclasses.replace(sampling, max_new_tokens=reply_len(plan.workload, plan.sampling))


def call_format(tokenizer: Tokenizer, chat: bool, thinking: bool) -> ToolFormat:
    """The tool-call convention of the turn format's template (`envs.call_formats`): the
    plain turn format's (`<tool_call>`) without a chat template."""
    if not chat:
        return ToolFormat.qwen
    return tool_format_of(lambda tools: tokenizer.chat(
        [{"role": "user", "content": "Hello."}], enable_thinking=thinking, tools=tools))


ROUND_TRIP = ({"role": "tool", "content": "5"}, {"role": "user", "content": "Go on."})
"""What the start-up probe gives after the probe's assistant reply: a tool result and a user
message (the template then writes the next assistant turn's prompt)."""


def check_turn_template(fmt: TurnFormat, family: str = "") -> None:
    """UserError (one line) when episodes would open in a checkpoint's own chat template that
    they cannot continue in (no end-of-turn stop token, or earlier turns rewritten as an
    episode grows: `tokenizers.continuation`), or, with tools, one that cannot render a whole
    tool round trip after its own turns (user, assistant call, tool result, assistant)."""
    try:
        fmt.own  # noqa: B018 (found and checked once, here)
        if fmt.tools:
            fmt.after_reply(ROUND_TRIP)
    except ValueError as err:
        what = f"model.family={family} " if family else ""
        calls = f" ({fmt.calls} tool calls)" if fmt.tools else ""
        raise UserError(f"workload.chat_template=true with {what}{fmt.tokenizer.name}'s own "
                        f"chat template{calls}: {err}; multi-turn episodes need a template "
                        "they can continue, Qwen3's (model.tokenizer=qwen) or none "
                        "(workload.chat_template=false)") from None


def _env_spec(plan: ExecutionPlan, workers: int, tokenizer: Tokenizer) -> EnvSpec:
    w = plan.workload
    calls = call_format(tokenizer, w.chat_template, w.enable_thinking)
    return EnvSpec(env=w.env, tools=tuple(w.tools.items()), step_timeout_s=w.env_timeout_s,
                   tool_timeout_s=w.tool_timeout_s, workers=workers, memory_mb=w.reward_memory_mb,
                   calls=calls, env_args=tuple(w.env_args.items()),
                   max_calls=w.max_tool_calls, max_result_tokens=w.max_tool_result_tokens)


def _turn_format(plan: ExecutionPlan, tokenizer: Tokenizer, schemas: Sequence[dict],
                 calls: ToolFormat) -> TurnFormat:
    w = plan.workload
    return TurnFormat(tokenizer, chat=w.chat_template, thinking=w.enable_thinking,
                      tools=tuple(schemas), calls=calls)


def turn_setup(plan: ExecutionPlan, tokenizer: Tokenizer, sampling: SamplingSettings,
               workers: int) -> TurnSetup | None:
    """The host's episode runner when the workload has an environment or tools (its workers
    started, the classes and functions checked there: `UserError` in one line), else None."""
    w = plan.workload
    if not multi_turn(w):
        return None
    runner = EnvRunner(_env_spec(plan, workers, tokenizer), tokenizer)
    try:
        schemas = runner.check()
        fmt = _turn_format(plan, tokenizer, schemas, runner.spec.calls)
        check_turn_template(fmt, plan.model.config.family)
        check_turn_alphabet(fmt, f"model.tokenizer={plan.model.config.tokenizer}")
    except BaseException:
        runner.close()
        raise
    reply = reply_len(w, plan.sampling)
    a = plan.algorithm
    limits = TurnLimits(prompt=plan.batch.max_prompt_len, episode=plan.batch.response_len,
                        reply=reply, turns=w.max_turns, stop_ids=sampling.stop_ids,
                        pad_id=sampling.pad_id, mask_failures=a.mask_env_failures,
                        overlong=a.overlong, overlong_buffer=a.overlong_buffer)
    return TurnSetup(runner, fmt, limits,
                     reply_settings(plan, sampling), w.prompt_template)


def warm_up_format(plan: ExecutionPlan, tokenizer: Tokenizer, turns: TurnSetup | None
                   ) -> TurnFormat | None:
    """The turn format the supervised warm-up writes reference episodes in: a tools-only
    multi-turn workload's (`turns`' where the host has them, else from one worker that checks
    the tools and stops); None for one-reply episodes and environment classes (whose opening
    is the class's: the warm-up trains the single-turn solution)."""
    w = plan.workload
    if not multi_turn(w) or w.env:
        return None
    if turns is not None:
        return turns.fmt
    runner = EnvRunner(_env_spec(plan, 1, tokenizer))
    try:
        fmt = _turn_format(plan, tokenizer, runner.check(), runner.spec.calls)
    finally:
        runner.close()
    check_turn_template(fmt, plan.model.config.family)
    check_turn_alphabet(fmt, f"model.tokenizer={plan.model.config.tokenizer}")
    return fmt


def reference_ids(fmt: TurnFormat, prompt: str, reference: Sequence[tuple[str, str]],
                  tools: Sequence[str]) -> tuple[list[int], list[int], list[bool]] | None:
    """A reference episode (`Problem.reference`) written as `run_episodes` writes one: the
    opening of [user: `prompt`]; then each assistant reply with its turn's end token (mask
    on) and the messages after it with the next generation prompt (mask off). None when a
    reply calls a tool not among `tools` (or a malformed one): the run could not replay it."""
    ids: list[int] = []
    mask: list[bool] = []
    pending: list[dict] = []
    for role, content in reference:
        if role != "assistant":
            pending.append({"role": role, "content": content})
            continue
        calls, malformed = FORMATS[fmt.calls].parse(content)
        if malformed or any(c.name not in tools for c in calls):
            return None
        if pending:
            more = fmt.after_reply(pending)
            ids, mask, pending = ids + more, mask + [False] * len(more), []
        reply = fmt.tokenizer.encode(content) + fmt.turn_end()
        ids, mask = ids + reply, mask + [True] * len(reply)
    return fmt.opening([{"role": "user", "content": prompt}]), ids, mask

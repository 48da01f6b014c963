"""The host-local phases of a step: prompts -> rollout -> rewards -> advantages -> train rows.

Nothing here crosses hosts: a host samples, scores and normalises only its own groups, and
under dynamic sampling keeps sampling its own prompts (`runtime.groups`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from functools import partial

import jax
import numpy as np

from compiler.axes import MeshAxis
from locojax.data import Problem, render_prompt
from locojax.envs.calculations import calculator_episode
from locojax.episodes.keys import StepKeys
from locojax.rewards import RewardBatch
from locojax.rollout.engine import Rollout, generate
from locojax.rollout.episodes import EpisodeCache
from locojax.rollout.sampler import SamplingSettings
from locojax.runtime.components import Host
from locojax.runtime.evaluation import EvalSamples, correct_grid
from locojax.runtime.groups import GroupCounts, GroupPool, batch_problems
from locojax.runtime.hostwork import (
    NO_TURNS,
    Completions,
    HostTimes,
    HostWork,
    Prompts,
    TurnCounts,
    say_failures,
    score_problems,
)
from locojax.runtime.turns import (
    Episodes,
    TurnFormat,
    cached_turn,
    episode_rows,
    episode_width,
    reference_ids,
    refilled,
    run_episodes,
    run_refilled,
    wave_rows,
    waves_of,
)


@dataclass(frozen=True)
class Episode:
    """One host's sampled, scored groups, as numpy rows ready for the global batch."""

    rows: dict[str, np.ndarray]
    """The planned rows (under dynamic sampling too) as TrainBatch fields: tokens_BxL,
    positions_BxL, valid_BxL, loss_mask_BxL, advantages_B, behaviour_logp_BxL, and
    rollout_logp_BxL when algorithm.rollout_logp."""
    rewards: RewardBatch
    """Every completion sampled (all batches)."""
    lengths_B: np.ndarray
    timings: dict[str, float]
    """rollout_s (generation, all batches), reward_s (detokenise + score), advantage_s
    (prompt encoding, advantages and rows: host_batch_s)."""
    truncated_prompts: int
    host: HostTimes
    """This host's host work by kind."""
    groups: GroupCounts
    """Groups sampled, zero-std and padded, batches (dynamic sampling)."""
    turns: TurnCounts = NO_TURNS
    """Turns, tool calls, environment errors and seconds (multi-turn episodes)."""


def host_work(host: Host) -> HostWork:
    """The host's CPU-side work (encode, detokenise, score, rows) with its tokenizer and scorer."""
    return HostWork(host.plan, host.tokenizer, host.data.scorer)


def encode_prompts(host: Host, problems: list[Problem]) -> tuple[np.ndarray, np.ndarray, int]:
    """Left-padded prompt ids (P x max_prompt_len), lengths, and how many were cut on the left."""
    p = host_work(host).encode(problems)
    return p.ids_BxP, p.len_B, p.truncated


def sample(host: Host, params, problems: list[Problem], settings: SamplingSettings,
           key: jax.Array, group_size: int) -> tuple[Rollout, int]:
    """Completions of `problems` on this process's rollout mesh through the plan's slots."""
    prompts = host_work(host).encode(problems)
    return generate_prompts(host, params, prompts, settings, key, group_size), prompts.truncated


def generate_prompts(host: Host, params, prompts: Prompts, settings: SamplingSettings,
                     key: jax.Array, group_size: int) -> Rollout:
    """Completions of encoded prompts on this process's rollout mesh, waited for."""
    out = generate((host.model.graphdef, params), (prompts.ids_BxP, prompts.len_B), settings, key,
                   group_size=group_size, mesh=host.model.rollout_mesh, batch_axis=MeshAxis.REPLICA,
                   options=host.engine)
    return jax.block_until_ready(out)


def eval_samples(host: Host, params, problems: list[Problem], key: jax.Array,
                 samples: int) -> EvalSamples:
    """`samples` completions of each of `problems`, scored as episodes are (held-out
    evaluation, `locojax-eval`): greedy for 1, at the sampling temperature for more.

    The batch is padded with copies of the first problem to a multiple of the rollout mesh's
    replicas (its rows must split over them); padded rows are decoded but not scored.
    """
    k, n = samples, len(problems)
    if not problems:
        return EvalSamples(np.zeros((0, k), bool), [], np.zeros((0, k), int),
                           np.zeros((0, k), bool))
    settings = host.greedy if k == 1 else host.sampling
    fill = -n % host.model.rollout_mesh.shape[MeshAxis.REPLICA]
    padded = [*problems, *[problems[0]] * fill]
    if host.data.turns is not None:
        found = eval_episodes(host, params, padded, n, key, k, settings)
    else:
        out, _ = sample(host, params, padded, settings, key, k)
        found = scored_samples(host_work(host), Completions.of(out), problems, k,
                               settings.stop_ids)
    say_host_failures(host, "evaluation")
    return found


def say_host_failures(host: Host, when: str) -> None:
    """`hostwork.say_failures` of this host's reward functions, environment and tools."""
    turns = host.data.turns
    say_failures(when, host.data.scorer, turns.runner.tallies if turns is not None else ())


def episode_caches(host: Host, params, settings: SamplingSettings) -> tuple[EpisodeCache, ...]:
    """The KV caches of a batch's episodes on this process's rollout mesh, one reply at
    `settings`: one per wave in flight (`batch.waves_in_flight`), all reading the weights
    the first placed on the mesh (one copy)."""
    caches: list[EpisodeCache] = []
    for _ in range(host.plan.batch.waves_in_flight):
        caches.append(EpisodeCache(host.model.graphdef, params, settings, episode_width(host.plan),
                                   mesh=host.model.rollout_mesh, batch_axis=MeshAxis.REPLICA))
        params = caches[-1].params
    return tuple(caches)


def episode_slots(host: Host, params, settings: SamplingSettings) -> EpisodeCache:
    """The slots of per-episode scheduling (`sampling.schedule=refill`) on this process's
    rollout mesh, started: the plan's slots on each replica (`turns.wave_rows`), one reply at
    `settings`."""
    cache = EpisodeCache(host.model.graphdef, params, settings, episode_width(host.plan),
                         mesh=host.model.rollout_mesh, batch_axis=MeshAxis.REPLICA)
    cache.start(wave_rows(host.plan))
    return cache


def host_episodes(host: Host, params, rows: list[dict], settings: SamplingSettings,
                  key: jax.Array, group: int) -> Episodes:
    """This host's episodes of `rows` on its rollout mesh through the plan's slots on each
    replica, each episode's KV cache kept across its turns: one reply a turn at `settings`,
    with the turn's key (`episodes.keys.turn_key`). `sampling.schedule=refill`: each episode's turn
    begins as its environment answered (`turns.run_refilled`, chunks of
    `sampling.decode_chunk` steps); `static`: in waves, turn by turn."""
    setup = host.data.turns
    per_wave = wave_rows(host.plan)
    if refilled(host.plan):
        caches = (episode_slots(host, params, settings),)
        steps = host.plan.sampling.decode_chunk
        eps = run_refilled(rows, setup.runner, setup.fmt, setup.limits,
                           lambda feeds, _: caches[0].advance(feeds, key, steps), group,
                           [len(rows)], per_wave, host.plan.sampling.decode_quorum)
    else:
        caches = episode_caches(host, params, settings)
        eps = run_episodes(rows, setup.runner, setup.fmt, setup.limits,
                           partial(cached_turn, caches, key, per_wave), group,
                           waves_of([len(rows)], per_wave), host.plan.batch.waves_in_flight)
    return dataclasses.replace(eps, slot_steps=sum(c.slot_steps for c in caches),
                               live_steps=sum(c.live_steps for c in caches))


def eval_episodes(host: Host, params, problems: list[Problem], n: int, key: jax.Array,
                  k: int, settings: SamplingSettings) -> EvalSamples:
    """`k` multi-turn episodes of each of `problems` at `settings` (one reply's length), the
    first `n` problems' scored as training's are (`episode_samples`)."""
    setup = host.data.turns
    reply = dataclasses.replace(settings, max_new_tokens=setup.reply.max_new_tokens)
    rows = episode_rows(problems, k, setup.template, host.plan.run.seed)
    eps = host_episodes(host, params, rows, reply, key, k)
    return episode_samples(host_work(host), eps, problems, rows, n, k)


def episode_samples(work: HostWork, eps: Episodes, problems: list[Problem], rows: list[dict],
                    n: int, k: int) -> EvalSamples:
    """Held-out samples of episodes, k per problem: the first `n` problems' last replies,
    whether the workload's reward finds them correct, their lengths (every token after the
    prompt) and whether a limit cut them (the correct flags None when correctness is
    unknown)."""
    scored = score_episodes(work, eps, problems, rows, HostTimes())
    m = n * k
    return EvalSamples(correct_grid(scored.correct_B, n, k),
                       [eps.last_texts[i * k:(i + 1) * k] for i in range(n)],
                       eps.completions.lengths_B[:m].reshape(n, k),
                       eps.truncated_B[:m].reshape(n, k))


def scored_samples(work: HostWork, comp: Completions, problems: list[Problem], k: int,
                   stop_ids: tuple[int, ...]) -> EvalSamples:
    """The first len(problems) x k rows of `comp` (k per problem, in order) decoded and
    scored by `work`'s scorer, as episodes are; a row is truncated when it ran out of tokens
    before a stop token."""
    n = len(problems)
    texts = work.texts(comp)[:n * k]
    scored = work.score(texts, problems, group=k)
    lengths_B = np.asarray(comp.lengths_B[:n * k])
    t = comp.mask_BxT.shape[1]
    last_B = comp.tokens_BxL[np.arange(n * k), comp.prompt_width + np.maximum(lengths_B, 1) - 1]
    truncated_B = (lengths_B >= t) & ~np.isin(last_B, list(stop_ids))
    return EvalSamples(correct_grid(scored.correct_B, n, k),
                       [texts[i * k:(i + 1) * k] for i in range(n)],
                       lengths_B.reshape(n, k), truncated_B.reshape(n, k))


def completions_text(host: Host, out: Rollout) -> list[str]:
    """Decoded completions, each cut at its own length."""
    return host_work(host).texts(Completions.of(out))


@dataclass(frozen=True)
class Sampled:
    """One batch of a host's problems, sampled and scored."""

    out: Completions
    rewards: RewardBatch
    rollout_s: float
    truncated_prompts: int
    turns: TurnCounts = NO_TURNS


def sample_once(host: Host, params, problems: list[Problem], key: jax.Array,
                times: HostTimes, step: int = 0) -> Sampled:
    """One prompt, one reply per episode: G completions per problem, scored."""
    work = host_work(host)
    t0 = time.perf_counter()
    prompts = work.encode(problems)
    t1 = time.perf_counter()
    out = Completions.of(generate_prompts(host, params, prompts, host.sampling, key,
                                          host.plan.batch.group_size))
    t2 = time.perf_counter()
    times.add("batch", t1 - t0)
    return Sampled(out, work.scored(out, problems, times), t2 - t1, prompts.truncated)


def sample_turns(host: Host, params, problems: list[Problem], key: jax.Array,
                 times: HostTimes, step: int = 0) -> Sampled:
    """G multi-turn episodes per problem (`runtime.turns`), on this host's devices and its
    environment workers (each group's environment seed from `step`); the last replies
    scored, plus the step rewards."""
    setup, group = host.data.turns, host.plan.batch.group_size
    t0 = time.perf_counter()
    rows = episode_rows(problems, group, setup.template, host.plan.run.seed, step)
    eps = host_episodes(host, params, rows, setup.reply, key, group)
    times.add("batch", time.perf_counter() - t0 - eps.rollout_s - eps.env_wait_s)
    rewards = score_episodes(host_work(host), eps, problems, rows, times)
    return Sampled(eps.completions, rewards, eps.rollout_s, eps.prompts_cut,
                   TurnCounts.of(eps))


def score_episodes(work: HostWork, eps: Episodes, problems: list[Problem], rows: list[dict],
                   times: HostTimes) -> RewardBatch:
    """The last replies scored by the workload's reward (reward functions get the transcript
    as a `messages` column), plus each episode's step rewards (and its overlong penalty,
    `algorithm.overlong=penalty`)."""
    t0 = time.perf_counter()
    group = len(rows) // max(len(problems), 1)
    scored = score_problems(work.scorer, eps.last_texts, problems, group,
                            work.plan.workload.prompt_template,
                            [{"messages": m} for m in eps.messages])
    times.add("score", time.perf_counter() - t0)
    times.samples += len(rows)
    extra_B = eps.env_rewards_B if eps.penalty_B is None else eps.env_rewards_B + eps.penalty_B
    return dataclasses.replace(scored, rewards_B=(scored.rewards_B + extra_B).astype(np.float32))


def step_episode(host: Host, params, step: int, prompt_range: tuple[int, int],
                 stream: int) -> Episode:
    """Sample G completions (multi-turn: episodes) per problem of the host's `prompt_range`
    of `step`, score them, and build its train rows; with algorithm.dynamic_sampling=filter,
    further batches of its own prompts until it has as many informative groups
    (`runtime.groups`). Keys: `episodes.keys.StepKeys(seed, step).sampling(stream, b)`."""
    plan, work, times = host.plan, host_work(host), HostTimes()
    host.data.scorer.set_step(step, plan.batch.prompts_per_step, len(host.data.workload.train))
    keys = StepKeys(plan.run.seed, step)
    pool = GroupPool.of(plan, prompt_range[1] - prompt_range[0])
    sample = sample_once if host.data.turns is None else sample_turns
    scored, truncated, turns = [], 0, NO_TURNS
    for b in range(pool.max_batches):
        if b and not pool.wanting:
            break
        problems = batch_problems(host.data.workload, host.data.stream, step, prompt_range, b,
                                  pool.max_batches)
        got = sample(host, params, problems, keys.sampling(stream, b), times, step)
        scored.append(got.rewards)
        pool.add(got.out, got.rewards.rewards_B, got.rollout_s)
        truncated += got.truncated_prompts
        turns = turns + got.turns
    t3 = time.perf_counter()
    rows, counts = pool.rows(work)
    times.add("batch", time.perf_counter() - t3)
    say_host_failures(host, f"step {step + 1}")
    s = times.seconds
    return Episode(rows=rows, rewards=RewardBatch.concat(scored),
                   lengths_B=pool.completions().lengths_B,
                   timings={"rollout_s": sum(pool.rollout_s), "reward_s": s["detok"] + s["score"],
                            "advantage_s": s["batch"]},
                   truncated_prompts=truncated, host=times, groups=counts, turns=turns)


def sft_rows(host: Host, problems: list[Problem], fmt: TurnFormat | None = None
             ) -> dict[str, np.ndarray]:
    """Prompt + reference solution + stop token, the solution tokens masked in (warm-up).

    With a multi-turn run's turn format (`turns.warm_up_format`), a problem's reference
    episode where it has one the run can replay (`turns.reference_ids`: the opening, the
    replies masked in, the messages between them masked out and attended), else its
    solution."""
    prompt_BxP, len_B, _ = encode_prompts(host, problems)
    width, t = prompt_BxP.shape[1], host.plan.batch.response_len
    sols = host.tokenizer.batch_encode([p.solution or p.answer for p in problems])
    tokens = np.full((len(problems), width + t), host.sampling.pad_id, np.int32)
    tokens[:, :width] = prompt_BxP
    loss_mask = np.zeros(tokens.shape, bool)
    end_B = np.zeros(len(problems), np.int64)
    tools = [t["function"]["name"] for t in fmt.tools] if fmt is not None else []
    for i, sol in enumerate(sols):
        target, trained = [*sol, host.tokenizer.eos_id], None
        episode = _reference(fmt, tools, problems[i], host.plan.workload.prompt_template)
        if episode is not None:
            opening, target, trained = episode
            opening = host.tokenizer.keep_end(opening, width)
            tokens[i, :width] = host.sampling.pad_id
            tokens[i, width - len(opening):width] = opening
            len_B[i] = len(opening)
        n = min(len(target), t)
        tokens[i, width:width + n] = target[:n]
        loss_mask[i, width:width + n] = trained[:n] if trained else True
        end_B[i] = width + n
    pad_B = width - len_B
    cols = np.arange(width + t)
    positions = np.maximum(cols[None, :] - pad_B[:, None], 0).astype(np.int32)
    valid = (cols[None, :] >= pad_B[:, None]) & (cols[None, :] < end_B[:, None])
    return {"tokens_BxL": tokens, "positions_BxL": positions, "valid_BxL": valid,
            "loss_mask_BxL": loss_mask}


def _reference(fmt: TurnFormat | None, tools: list[str], problem: Problem, template: str
               ) -> tuple[list[int], list[int], list[bool]] | None:
    """`turns.reference_ids` of the problem's reference episode (its own, else its
    solution's calculator annotations with `calculate`: `envs.calculations`), or None (no
    format, no reference, or one calling a tool not among the run's `tools`)."""
    if fmt is None:
        return None
    reference = problem.reference
    if reference is None and problem.solution and "calculate" in tools:
        reference = calculator_episode(problem.solution)
    if reference is None:
        return None
    return reference_ids(fmt, render_prompt(problem, template), reference, tools)

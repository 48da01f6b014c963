"""The host-local phases of a step: prompts -> rollout -> rewards -> advantages -> train rows.

Nothing here crosses hosts: a host samples, scores and normalises only its own groups.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import numpy as np

from locojax.data import Problem, render_prompt
from locojax.rewards import RewardBatch
from locojax.rollout.engine import Rollout, generate, pad_prompts
from locojax.rollout.sampler import SamplingSettings
from locojax.runtime.components import Host
from locojax.tokenizers import apply_chat_template
from locojax.train import group_advantages


@dataclass(frozen=True)
class Episode:
    """One host's sampled, scored groups, as numpy rows ready for the global batch."""

    rows: dict[str, np.ndarray]
    """TrainBatch fields: tokens_BxL, positions_BxL, valid_BxL, loss_mask_BxL, advantages_B,
    behaviour_logp_BxL, and rollout_logp_BxL when algorithm.tis_cap > 0."""
    rewards: RewardBatch
    lengths_B: np.ndarray
    timings: dict[str, float]
    truncated_prompts: int


EVAL_STREAM = 99
"""Key stream of held-out evaluation (host indices are the sampling streams)."""


def step_key(seed: int, step: int, stream: int) -> jax.Array:
    """Per-step, per-host PRNG key: resumable, and a re-sampled step draws the same samples."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), step), stream)


def encode_prompts(host: Host, problems: list[Problem]) -> tuple[np.ndarray, np.ndarray, int]:
    """Left-padded prompt ids (P x max_prompt_len), lengths, and how many were cut on the left."""
    workload = host.plan.workload
    chat = (partial(_user_turn, thinking=workload.enable_thinking) if workload.chat_template
            else None)
    texts = [render_prompt(p, workload.prompt_template, chat) for p in problems]
    width = host.plan.batch.max_prompt_len
    ids = host.tokenizer.batch_encode(texts)
    truncated = sum(len(x) > width for x in ids)
    prompt_BxP, len_B = pad_prompts([x[-width:] for x in ids], host.sampling.pad_id, length=width)
    return prompt_BxP, len_B, truncated


def _user_turn(text: str, thinking: bool) -> str:
    return apply_chat_template([{"role": "user", "content": text}], enable_thinking=thinking)


def sample(host: Host, params, problems: list[Problem], settings: SamplingSettings,
           key: jax.Array, group_size: int) -> tuple[Rollout, int]:
    """Completions of `problems` on this process's rollout mesh, through the plan's slots."""
    prompt_BxP, len_B, truncated = encode_prompts(host, problems)
    out = generate((host.graphdef, params), (prompt_BxP, len_B), settings, key,
                   group_size=group_size, mesh=host.rollout_mesh, batch_axis="replica",
                   options=host.engine)
    return jax.block_until_ready(out), truncated


def greedy_correct(host: Host, params, problems: list[Problem], key: jax.Array) -> float:
    """Correct answers among `problems`, decoded greedily (held-out evaluation).

    The batch is padded with copies of the first problem to a multiple of the rollout mesh's
    replicas (its rows must split over them); padded rows are decoded but not scored.
    """
    if not problems:
        return 0.0
    fill = -len(problems) % host.rollout_mesh.shape["replica"]
    out, _ = sample(host, params, [*problems, *[problems[0]] * fill], host.greedy, key, 1)
    texts = completions_text(host, out)[:len(problems)]
    return float(host.scorer.score_batch(texts, [p.answer for p in problems]).correct_B.sum())


def completions_text(host: Host, out: Rollout) -> list[str]:
    """Decoded completions, each cut at its own length."""
    comp = np.asarray(out.completion_BxT)
    lengths = np.asarray(out.lengths_B)
    return host.tokenizer.batch_decode([row[:n].tolist() for row, n in zip(comp, lengths,
                                                                           strict=True)])


def run_episode(host: Host, params, problems: list[Problem], key: jax.Array) -> Episode:
    """Sample G completions per problem, score them, and build this host's train rows."""
    g = host.plan.batch.group_size
    t0 = time.perf_counter()
    out, truncated = sample(host, params, problems, host.sampling, key, g)
    t1 = time.perf_counter()
    texts = completions_text(host, out)
    refs = [p.answer for p in problems for _ in range(g)]
    rewards = host.scorer.score_batch(texts, refs)
    t2 = time.perf_counter()
    adv_B = np.asarray(group_advantages(
        rewards.rewards_B.reshape(len(problems), g),
        normalize_std=host.grpo.normalize_advantage_std,
    )).reshape(-1)
    rows = train_rows(out, adv_B, sampling_logp=host.grpo.tis_cap > 0)
    t3 = time.perf_counter()
    return Episode(rows=rows, rewards=rewards, lengths_B=np.asarray(out.lengths_B),
                   timings={"rollout_s": t1 - t0, "reward_s": t2 - t1, "advantage_s": t3 - t2},
                   truncated_prompts=truncated)


def train_rows(out: Rollout, advantages_B: np.ndarray, sampling_logp: bool = False
               ) -> dict[str, Any]:
    """Token-aligned TrainBatch fields: completion token t sits at column width + t.

    `behaviour_logp_BxL` is the engine's log pi_old (at the sampling temperature);
    `sampling_logp` adds `rollout_logp_BxL`, the log-prob under the distribution actually
    sampled (top-k / top-p included), for the truncated importance weight (tis_cap > 0).
    """
    width = out.prompt_width
    tokens = np.asarray(out.tokens_BxL)
    b, length = tokens.shape
    mask_BxT = np.asarray(out.mask_BxT) > 0
    loss_mask = np.zeros((b, length), bool)
    loss_mask[:, width:] = mask_BxT
    def aligned(logp_BxT) -> np.ndarray:
        logp_BxL = np.zeros((b, length), np.float32)
        logp_BxL[:, width:] = np.where(mask_BxT, np.asarray(logp_BxT), 0.0)
        return logp_BxL

    extra = {"rollout_logp_BxL": aligned(out.logp_BxT)} if sampling_logp else {}
    return {
        "tokens_BxL": tokens.astype(np.int32),
        "positions_BxL": np.asarray(out.positions_BxL()).astype(np.int32),
        "valid_BxL": np.asarray(out.valid_BxL()),
        "loss_mask_BxL": loss_mask,
        "advantages_B": advantages_B.astype(np.float32),
        "behaviour_logp_BxL": aligned(out.logp_model_BxT),
        **extra,
    }


def sft_rows(host: Host, problems: list[Problem]) -> dict[str, np.ndarray]:
    """Prompt + reference solution + stop token, the solution tokens masked in (warm-up)."""
    prompt_BxP, len_B, _ = encode_prompts(host, problems)
    width, t = prompt_BxP.shape[1], host.plan.batch.response_len
    eos = host.tokenizer.eos_id
    sols = host.tokenizer.batch_encode([p.solution or p.answer for p in problems])
    b = len(problems)
    tokens = np.full((b, width + t), host.sampling.pad_id, np.int32)
    tokens[:, :width] = prompt_BxP
    loss_mask = np.zeros((b, width + t), bool)
    for i, sol in enumerate(sols):
        target = ([*sol, eos])[:t]
        tokens[i, width:width + len(target)] = target
        loss_mask[i, width:width + len(target)] = True
    pad_B = width - len_B
    cols = np.arange(width + t)
    positions = np.maximum(cols[None, :] - pad_B[:, None], 0).astype(np.int32)
    valid = (cols[None, :] >= pad_B[:, None]) & ((cols[None, :] < width) | loss_mask)
    return {"tokens_BxL": tokens, "positions_BxL": positions, "valid_BxL": valid,
            "loss_mask_BxL": loss_mask}

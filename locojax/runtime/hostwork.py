"""The CPU side of a step, in numpy: the same code on a CO host and on the single controller.

    problems ──encode (tokenise, left-pad)──> prompt ids                    host_batch_s
    rollout on the devices ──> Completions (numpy: ids, log-probs, lengths)
    Completions ──detokenise──> texts                                       host_detok_s
    texts, reference answers ──score (Scorer, its worker pool)──> rewards   host_score_s
    rewards ──group advantages──> advantages ──train rows──> TrainBatch rows host_batch_s

A CO host runs it on its own prompts; the single controller's driver runs it on every
host's completions after gathering them. At the end of a step (and of an evaluation) each
kind of the user's code that failed is told in one warning line (`say_failures`). Nothing here makes a JAX array, so the driver never
starts a JAX backend (it owns no devices).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from functools import partial

import numpy as np

from compiler.config import MeshKind
from compiler.plan import ExecutionPlan
from compiler.vocab import RewardKind
from locojax.data import Problem, render_prompt
from locojax.rewards import RewardBatch, Scorer
from locojax.rewards.tally import Tally
from locojax.rollout.engine import pad_prompts
from locojax.tokenizers import Tokenizer
from locojax.train.advantages import group_advantages

HOST_KINDS = ("dispatch", "gather", "scatter", "detok", "score", "batch")
"""Kinds of host work timed per step; metrics rows hold `host_<kind>_s` for each."""


@dataclass(frozen=True)
class Prompts:
    """Left-padded prompt ids of some problems."""

    ids_BxP: np.ndarray
    """int32, left-padded with the tokenizer's pad id to the plan's max_prompt_len."""
    len_B: np.ndarray
    """int32 real prompt tokens per row (after any cut)."""
    truncated: int
    """Prompts longer than the width, cut on the left."""


@dataclass(frozen=True)
class Completions:
    """What host work needs of a rollout of B = prompts x G rows, as numpy arrays."""

    tokens_BxL: np.ndarray
    """int32 left-padded prompt, then the T completion ids."""
    mask_BxT: np.ndarray
    """bool: real completion tokens (stop token included)."""
    logp_model_BxT: np.ndarray
    """float32 log-prob of each sampled id under the model at the sampling temperature (the
    behaviour policy, pi_old)."""
    logp_BxT: np.ndarray
    """float32 log-prob of each sampled id under the distribution actually sampled (top-k /
    top-p included): the rollout correction's denominator (rollout_correction != none)."""
    lengths_B: np.ndarray
    """int32 completion tokens per row."""
    prompt_len_B: np.ndarray
    """int32 real prompt tokens per row."""

    @property
    def prompt_width(self) -> int:
        """Padded prompt length: completion token t sits at column prompt_width + t."""
        return self.tokens_BxL.shape[1] - self.mask_BxT.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays (what a gather to the controller moves)."""
        return sum(getattr(self, f.name).nbytes for f in fields(self))

    @classmethod
    def of(cls, out) -> Completions:
        """From a `locojax.rollout.engine.Rollout` (device or numpy arrays)."""
        return cls(tokens_BxL=np.asarray(out.tokens_BxL, np.int32),
                   mask_BxT=np.asarray(out.mask_BxT) > 0,
                   logp_model_BxT=np.asarray(out.logp_model_BxT, np.float32),
                   logp_BxT=np.asarray(out.logp_BxT, np.float32),
                   lengths_B=np.asarray(out.lengths_B, np.int32),
                   prompt_len_B=np.asarray(out.prompt_len_B, np.int32))

    def rows(self, start: int, stop: int) -> Completions:
        """Rows [start, stop) of every array."""
        return Completions(**{f.name: getattr(self, f.name)[start:stop] for f in fields(self)})

    @classmethod
    def concat(cls, parts: Sequence[Completions]) -> Completions:
        """Rows of several hosts, in host order (equal prompt widths)."""
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                      for f in fields(cls)})


@dataclass
class HostTimes:
    """Seconds and bytes of one step's host work, by kind (see HOST_KINDS)."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(HOST_KINDS, 0.0))
    gather_bytes: int = 0
    scatter_bytes: int = 0
    dispatches: int = 0
    """Driver-to-worker calls whose round trips `dispatch` holds (0 on a CO host)."""
    samples: int = 0
    """Completions this process detokenised, scored and turned into rows."""

    def add(self, kind: str, seconds: float) -> None:
        self.seconds[kind] += seconds

    def fields(self) -> dict[str, float]:
        """Metrics-row fields: host_<kind>_s, the bytes, dispatches, samples, per-sample s."""
        out: dict[str, float] = {f"host_{k}_s": v for k, v in self.seconds.items()}
        n = max(self.samples, 1)
        out |= {f"host_{k}_s_per_sample": self.seconds[k] / n for k in ("detok", "score", "batch")}
        out |= {"host_gather_bytes": self.gather_bytes, "host_scatter_bytes": self.scatter_bytes,
                "host_dispatches": self.dispatches, "host_samples": self.samples}
        return out


@dataclass(frozen=True)
class TurnCounts:
    """One host's turn statistics of a step (all zero for single-turn episodes)."""

    episodes: float = 0.0
    turns: float = 0.0
    turns_max: float = 0.0
    tool_calls: float = 0.0
    tool_errors: float = 0.0
    env_errors: float = 0.0
    tool_results_cut: float = 0.0
    tool_calls_dropped: float = 0.0
    env_s: float = 0.0
    env_wait_s: float = 0.0
    episodes_truncated: float = 0.0
    slot_steps: float = 0.0
    live_steps: float = 0.0
    masked_env_failures: float = 0.0
    masked_overlong: float = 0.0

    @classmethod
    def of(cls, e) -> TurnCounts:
        """The counts of `runtime.turns.Episodes` `e`."""
        return cls(episodes=float(len(e.turns_B)), turns=float(e.turns_B.sum()),
                   turns_max=float(e.turns_B.max(initial=0)), tool_calls=float(e.tool_calls),
                   tool_errors=float(e.tool_errors), env_errors=float(e.env_errors),
                   tool_results_cut=float(e.tool_results_cut),
                   tool_calls_dropped=float(e.tool_calls_dropped),
                   env_s=float(e.env_s), env_wait_s=float(e.env_wait_s),
                   episodes_truncated=float(e.truncated_B.sum()),
                   slot_steps=float(e.slot_steps), live_steps=float(e.live_steps),
                   masked_env_failures=float(e.masked_failures),
                   masked_overlong=float(e.masked_overlong))

    def __add__(self, other: TurnCounts) -> TurnCounts:
        """Counts of two batches (turns_max: the larger)."""
        return TurnCounts(**{k: (max if k == "turns_max" else float.__add__)(
            getattr(self, k), getattr(other, k)) for k in self.__dataclass_fields__})


NO_TURNS = TurnCounts()
"""The counts of single-turn episodes."""

log = logging.getLogger(__name__)


def say_failures(when: str, scorer: Scorer, runner_tallies: Iterable[Tally] = ()) -> None:
    """One warning line per kind of the user's code that failed since the last call (each
    reward function of `scorer`, the environment and its tools: `runner_tallies`), with the
    count and the first failure, headed `when` ("step 3"); silent when none failed. Every
    mode calls it once at the end of each step and each evaluation."""
    for tally in [*scorer.fns.tallies.values(), *runner_tallies]:
        line = tally.take()
        if line is not None:
            log.warning("%s: %s", when, line)


def host_cores(plan: ExecutionPlan, driver: bool = False) -> int:
    """Cores this process's host work may use: its machine's, shared among the hosts emulated
    on one machine (mesh=cpu) unless it is the single controller's driver, which works while
    its workers wait."""
    cores = os.cpu_count() or 1
    shared = plan.topology.mesh_kind == MeshKind.cpu and not driver
    return max(cores // plan.topology.hosts, 1) if shared else cores


def completion_ids(c: Completions) -> list[list[int]]:
    """Each completion's token ids, cut at its own length."""
    width = c.prompt_width
    return [row[width:width + n].tolist() for row, n in zip(c.tokens_BxL, c.lengths_B,
                                                            strict=True)]


def _conversational(problem: Problem, template: str, text: str) -> tuple[object, object]:
    """(prompt, completion) as a reward function of the user's gets them: TRL's
    conversational form (message lists) for a row in chat form, else the texts."""
    if problem.messages is None:
        return render_prompt(problem, template), text
    return ([{"role": r, "content": c} for r, c in problem.messages],
            [{"role": "assistant", "content": text}])


def score_problems(scorer: Scorer, texts: Sequence[str], problems: Sequence[Problem],
                   group: int, template: str,
                   extra: Sequence[dict] | None = None) -> RewardBatch:
    """Score `group` adjacent completions per problem: reference answers, and for reward
    functions of the user's the prompts and completions (message lists for rows in chat
    form, as TRL passes conversational data), the rows' other columns (with `extra`'s
    columns of each completion: `completion_ids`, a multi-turn transcript's `messages`) and
    the row ids."""
    rows = [p for p in problems for _ in range(group)]
    if scorer.settings.kind != RewardKind.python:
        return scorer.score_batch(texts, [p.answer for p in rows])
    pairs = [_conversational(p, template, t) for p, t in zip(rows, texts, strict=True)]
    more = extra if extra is not None else [{} for _ in rows]
    return scorer.score_batch([c for _, c in pairs], [p.answer for p in rows],
                              [q for q, _ in pairs],
                              [(p.columns or {}) | m for p, m in zip(rows, more, strict=True)],
                              [p.uid for p in rows])


class HostWork:
    """Encode, detokenise, score and build train rows for the plan's workload."""

    def __init__(self, plan: ExecutionPlan, tokenizer: Tokenizer, scorer: Scorer):
        self.plan, self.tokenizer, self.scorer = plan, tokenizer, scorer
        self.group = plan.batch.group_size

    def encode(self, problems: Sequence[Problem]) -> Prompts:
        """Left-padded prompt ids at the plan's width; longer prompts keep their end."""
        w = self.plan.workload
        tok = self.tokenizer
        chat = partial(_user_turn, tok, thinking=w.enable_thinking) if w.chat_template else None
        # Rows in chat form (`workload.messages_field`) always go through the chat template.
        chat_messages = partial(tok.chat, enable_thinking=w.enable_thinking)
        ids = tok.encode_prompts([render_prompt(p, w.prompt_template, chat, chat_messages)
                                  for p in problems])
        width = self.plan.batch.max_prompt_len
        if not ids:  # a host's share of no problems (greedy eval with eval_prompts < hosts)
            return Prompts(np.zeros((0, width), np.int32), np.zeros(0, np.int32), 0)
        ids_BxP, len_B = pad_prompts([tok.keep_end(x, width) for x in ids], tok.pad_id,
                                     length=width)
        return Prompts(ids_BxP, len_B, sum(len(x) > width for x in ids))

    def texts(self, c: Completions) -> list[str]:
        """Decoded completions, each cut at its own length."""
        return self.tokenizer.batch_decode(completion_ids(c))

    def score(self, texts: Sequence[str], problems: Sequence[Problem],
              group: int | None = None, ids: Sequence[list[int]] | None = None) -> RewardBatch:
        """Rewards of G completions per problem (`group`, default the plan's), rows of one
        problem adjacent; this host's scorer scores them (host-local reward). `ids`: each
        completion's token ids, a reward function's `completion_ids`."""
        extra = None if ids is None else [{"completion_ids": x} for x in ids]
        return score_problems(self.scorer, texts, problems, group or self.group,
                              self.plan.workload.prompt_template, extra)

    def rows(self, c: Completions, rewards_B: np.ndarray) -> dict[str, np.ndarray]:
        """Group advantages of `rewards_B` (G adjacent rows a group) and the token-aligned
        TrainBatch fields."""
        adv_B = group_advantages(np.asarray(rewards_B).reshape(-1, self.group),
                                 normalize_std=self.plan.algorithm.normalize_advantage_std)
        return train_rows(c, np.asarray(adv_B).reshape(-1),
                          sampling_logp=self.plan.algorithm.rollout_logp)

    def scored(self, c: Completions, problems: Sequence[Problem],
               times: HostTimes) -> RewardBatch:
        """Detokenise and score `c`, timing each kind into `times`."""
        t0 = time.perf_counter()
        ids = completion_ids(c)
        texts = self.tokenizer.batch_decode(ids)
        t1 = time.perf_counter()
        rewards = self.score(texts, problems, ids=ids)
        times.add("detok", t1 - t0)
        times.add("score", time.perf_counter() - t1)
        times.samples += len(texts)
        return rewards

    def process(self, c: Completions, problems: Sequence[Problem],
                times: HostTimes) -> tuple[dict[str, np.ndarray], RewardBatch]:
        """Detokenise, score and build the rows of `c`, timing each kind into `times`."""
        rewards = self.scored(c, problems, times)
        t0 = time.perf_counter()
        rows = self.rows(c, rewards.rewards_B)
        times.add("batch", time.perf_counter() - t0)
        return rows, rewards


def _user_turn(tokenizer: Tokenizer, text: str, thinking: bool) -> str:
    """`text` as one user message and the generation prompt, by the tokenizer's template."""
    return tokenizer.chat([{"role": "user", "content": text}], enable_thinking=thinking)


def train_rows(c: Completions, advantages_B: np.ndarray, sampling_logp: bool = False
               ) -> dict[str, np.ndarray]:
    """Token-aligned TrainBatch fields: completion token t sits at column width + t.

    `behaviour_logp_BxL` is the engine's log pi_old (at the sampling temperature);
    `sampling_logp` adds `rollout_logp_BxL`, the log-prob under the distribution actually
    sampled, for the rollout correction (rollout_correction != none).
    """
    width = c.prompt_width
    b, length = c.tokens_BxL.shape
    loss_mask = np.zeros((b, length), bool)
    loss_mask[:, width:] = c.mask_BxT

    def aligned(logp_BxT: np.ndarray) -> np.ndarray:
        logp_BxL = np.zeros((b, length), np.float32)
        logp_BxL[:, width:] = np.where(c.mask_BxT, logp_BxT, 0.0)
        return logp_BxL

    extra = {"rollout_logp_BxL": aligned(c.logp_BxT)} if sampling_logp else {}
    col_L = np.arange(length, dtype=np.int32)
    first_B = (width - c.prompt_len_B)[:, None]
    return {
        "tokens_BxL": c.tokens_BxL,
        "positions_BxL": np.maximum(col_L[None, :] - first_B, 0).astype(np.int32),
        "valid_BxL": (col_L[None, :] >= first_B) & (col_L[None, :] < width + c.lengths_B[:, None]),
        "loss_mask_BxL": loss_mask,
        "advantages_B": advantages_B.astype(np.float32),
        "behaviour_logp_BxL": aligned(c.logp_model_BxT),
        **extra,
    }

"""The supervised warm-up: supervised steps on reference solutions before RL.

    warm_up(host, sft_step, params, ...) -> (params, (first loss, last loss) | None)
        algorithm.sft_warmup_steps steps, each on the prompts of a stream seeded apart from
        RL's (run.seed + SFT_SEED_OFFSET; this process feeds [start, stop) of each batch),
        numbered before RL's steps and not logged as RL (a multi-turn run with tools trains
        the problems' reference episodes, `episode.sft_rows`); an optimizer state of its own that
        lives only here; a non-finite step raises through `guard`; a signal stops it at a
        step boundary every process agrees on (CO hosts vote as in the RL loop) and nothing
        of it is saved (`Interrupted`). Actors (DA, single) get no signal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import jax
import numpy as np

from locojax.data import DataPosition, PromptStream
from locojax.runtime import assemble
from locojax.runtime.components import Host
from locojax.runtime.episode import sft_rows
from locojax.runtime.process.distributed import every_host
from locojax.runtime.process.stop import (
    WARM_UP_NOT_SAVED,
    Interrupted,
    StopSignals,
    agreed_signal,
    answers_signals,
    set_phase,
)
from locojax.runtime.train_programs import global_batch
from locojax.runtime.turns import warm_up_format
from locojax.train import SftBatch, init_opt_state, make_optimizer

SFT_SEED_OFFSET = 1_000_003
"""The warm-up's prompt stream seed is run.seed + this, so RL sees the same prompts either way."""


def warm_up(host: Host, sft_step: Callable, params, *, shardings, frozen: tuple,
            sft_range: tuple[int, int], guard: Callable[[int, dict, str], None],
            log: Callable[[str], None]):
    """`params` (laid out on `shardings`) after the warm-up, and its first and last loss
    (None and `params` unchanged when algorithm.sft_warmup_steps is 0). `frozen`: the
    step's trailing arguments; `guard(step, metrics, phase)` raises on a non-finite step."""
    plan = host.plan
    n = plan.algorithm.sft_warmup_steps
    if n == 0:
        return params, None
    tx = make_optimizer(assemble.sft_optimizer(plan.algorithm))
    opt_state = init_opt_state(tx, params, shardings)
    stream = PromptStream(len(host.data.workload.train), plan.batch.prompts_per_step,
                          DataPosition(plan.run.seed + SFT_SEED_OFFSET))
    fmt = warm_up_format(plan, host.tokenizer, host.data.turns)
    losses = []
    votes = answers_signals()
    with StopSignals() if votes else contextlib.nullcontext() as stop:
        for i in range(n):
            set_phase(f"the supervised warm-up (step {i + 1} of {n})", WARM_UP_NOT_SAVED)
            problems = [host.data.workload.train[int(j)] for j in stream.batch(i, *sft_range)]
            batch = global_batch(host, sft_rows(host, problems, fmt), SftBatch)
            params, opt_state, metrics = sft_step(params, opt_state, batch, *frozen)
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()
                       if np.ndim(v) == 0}
            guard(i + 1, metrics, "supervised warm-up step")
            losses.append(metrics["loss"])
            signum = agreed_signal(every_host(np.array([stop.flag])).ravel().tolist()) \
                if votes else None
            if signum is not None:
                raise Interrupted(signum, f"the supervised warm-up (after step {i + 1} of "
                                          f"{n})", WARM_UP_NOT_SAVED)
    set_phase("start-up")
    log(f"supervised warm-up: {n} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return params, (losses[0], losses[-1])

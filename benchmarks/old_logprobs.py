"""Where pi_old should come from: the engine's log-probs against the trainer's own, and what
the trainer's extra forward costs (`algorithm.old_logprobs=rollout|recompute`).

1. Mismatch. A Qwen3 with random weights whose embedding (tied: also the output matrix) is
   scaled (x3 by default) so that its samples look like a trained model's (mean negative
   log-prob of the sampled tokens ~1.4 nats at temperature 0.7 at Qwen3-0.6B widths, not the
   ~12 of a uniform vocabulary) generates
   16 rows x 64 tokens with the rollout engine (compute-dtype weights); the trainer then scores
   the same tokens (`make_logprob_fn`, fp32 master weights cast in its forward, temperature
   0.7). Reported: max, mean and 99th percentile of |log pi_engine - log pi_trainer| over the
   sampled tokens, per compute dtype; exp(max) - 1 is how far the PPO ratio of an unchanged
   policy is from 1 at worst (the clip is 0.2).
2. Cost. At the standard CPU shape (tiny Qwen3 at vocab 151,936, 16 x 96 tokens, 64 of them
   response, fp32) the median seconds of the recompute program (`make_rescore_fn`) over the
   median seconds of the train step.

    .venv/bin/python benchmarks/old_logprobs.py [--widths tiny|qwen3_0_6b] [--layers 2]
        [--dtypes float32 bfloat16] [--scale 3] [--runs 3] [--tiny]

The last stdout line is JSON: {"mismatch": {"float32": {...}, "bfloat16": {...}},
"recompute_over_step": r, ...}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import numpy as np
from flax import nnx
from train_step import SHAPES, TINY, batch, timed

from compiler.vocab import LossAggregation
from locojax.model import ModelArch, Qwen3, compute_copy, split_params
from locojax.rollout.engine import generate
from locojax.rollout.sampler import SamplingSettings
from locojax.train import (
    ForwardSettings,
    GrpoSettings,
    init_opt_state,
    make_logprob_fn,
    make_optimizer,
    make_rescore_fn,
    make_train_step,
)

TEMPERATURE, ROWS, PROMPT, NEW = 0.7, 16, 32, 64


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def mismatch(arch: ModelArch, scale: float, rows: int, prompt: int, new: int) -> dict:
    """|engine - trainer| log-probs of the engine's own samples (module docstring, part 1)."""
    graphdef, params = split_params(Qwen3(arch, rngs=nnx.Rngs(0)))
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x * scale if "embedding" in jax.tree_util.keystr(path) else x, params)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, arch.vocab, prompt)) for _ in range(rows // 4)]
    settings = SamplingSettings(temperature=TEMPERATURE, max_new_tokens=new)
    r = generate((graphdef, compute_copy(params, arch)), prompts, settings, jax.random.key(0),
                 group_size=4)
    fwd = ForwardSettings(response_len=new, temperature=TEMPERATURE)
    trainer = make_logprob_fn(graphdef, forward=fwd)(params, r.tokens_BxL, r.positions_BxL(),
                                                     r.valid_BxL())
    mask = np.asarray(r.mask_BxT) > 0
    engine = np.asarray(r.logp_model_BxT)[mask]
    d = np.abs(np.asarray(trainer)[:, -new:][mask] - engine)
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()),
            "p99_abs": float(np.quantile(d, 0.99)), "ratio_off_max": float(np.expm1(d.max())),
            "mean_nll": float(-engine.mean()), "tokens": int(mask.sum())}


def cost(arch: ModelArch, runs: int, rows: int, prompt: int, response: int) -> dict:
    """Seconds of the recompute program and of the train step (module docstring, part 2)."""
    graphdef, params = split_params(Qwen3(arch, rngs=nnx.Rngs(0)))
    settings = GrpoSettings(aggregation=LossAggregation.token_mean, max_response_len=response,
                            forward=ForwardSettings(response_len=response))
    data = batch(arch, rows, prompt, response)
    rescore = make_rescore_fn(graphdef, settings, recompute_old=True, with_reference=False)
    step = make_train_step(graphdef, settings, donate=False)
    opt_state = init_opt_state(make_optimizer(settings.optimizer), params)
    calls = {"recompute_s": lambda: jax.block_until_ready(rescore(params, None, data)),
             "step_s": lambda: jax.block_until_ready(step(params, opt_state, data))}
    for fn in calls.values():
        fn()
    times = {k: [] for k in calls}
    for _ in range(runs):
        for k, fn in calls.items():
            times[k].append(timed(fn))
    out = {k: statistics.median(v) for k, v in times.items()}
    out["recompute_over_step"] = out["recompute_s"] / out["step_s"]
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="qwen3_0_6b", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--scale", type=float, default=3.0,
                        help="embedding scale (peaks the random model's distributions)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (smoke test)")
    args = parser.parse_args(argv)
    shape, vocab, rows, prompt, new = dict(SHAPES[args.widths]), 151_936, ROWS, PROMPT, NEW
    shape["num_layers"] = args.layers
    if args.tiny:
        shape, vocab, rows, prompt, new = {**shape, **TINY}, 512, 4, 8, 8
    report = {"mismatch": {}, "temperature": TEMPERATURE, "scale": args.scale,
              "widths": args.widths, "layers": args.layers}
    for dtype in args.dtypes:
        arch = ModelArch(**shape, vocab=vocab, dtype=dtype)
        start = time.perf_counter()
        report["mismatch"][dtype] = m = mismatch(arch, args.scale, rows, prompt, new)
        log(f"{dtype}: max |d logp| {m['max_abs']:.3g}, mean {m['mean_abs']:.3g}, p99 "
            f"{m['p99_abs']:.3g} over {m['tokens']} tokens (mean nll {m['mean_nll']:.2f}; "
            f"{time.perf_counter() - start:.0f} s)")
    standard = dict(SHAPES["cpu_standard"])
    if args.tiny:
        standard = {**standard, **TINY}
    c = cost(ModelArch(**standard, vocab=vocab), args.runs, rows, 32 if not args.tiny else 8,
             64 if not args.tiny else 8)
    report.update(c)
    log(f"standard shape: recompute {c['recompute_s']:.3f} s, step {c['step_s']:.3f} s "
        f"({c['recompute_over_step']:.2f} of a step)")
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()

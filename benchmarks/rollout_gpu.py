"""GSM8K rollout of Qwen3-0.6B (random weights, bf16) at the paper's sizes, with the plan's slots.

    384 prompts x 8 samples, prompts left-padded to 256 tokens, responses up to 768; the plan
    is `+experiment=gsm8k_co` on this one device (colocated: its slots are what the KV budget
    leaves beside the weights, the prompt KV store and the training state). The stop ids'
    logit is raised by `--stop-bias` (default ln(V / (T / 3)): random weights give each token
    a logit of about N(0, 1), so a step stops a row with probability ~3 / T and lengths are
    roughly geometric with mean ~T / 3; the measured mean is printed). Then:

    refill (compile, then one timed call) and static (compile, one timed call), the same
    rows (same key): useful tokens/s (tokens up to each row's stop), prefill seconds, decode
    steps, and the share of slot-steps spent on finished rows or empty slots; the device's
    peak memory against the plan's `batch.rollout_bytes_per_device`, and XLA's own count of
    the compiled programs.

GPU (one device, ~5 minutes):

    .venv/bin/python benchmarks/rollout_gpu.py

CPU smoke (tiny model, Qwen's vocabulary; 4 GSM8K prompts x 8, prompt 128, response 48; a
minute or two):

    .venv/bin/python benchmarks/rollout_gpu.py --tiny

The last stdout line is JSON: {"plan": {...}, "refill": {...}, "static": {...}, "memory": {...}}.
Prompts come from GSM8K's train split (`--data-dir`, default ../shared/data/gsm8k or
./shared/data/gsm8k); without it, random ids of GSM8K's prompt lengths (said on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _plan(tiny: bool, data_dir: Path | None):
    import jax

    from compiler import compile_plan
    from locojax.config.compose import compose_config

    overrides = ["+experiment=gsm8k_co"]
    if data_dir is not None:
        overrides.append(f"workload.data_dir={data_dir}")
    if tiny:
        overrides += ["model=tiny", "mesh=cpu", "mesh.hosts=1", "mesh.devices_per_host=1",
                      "workload.prompts_per_step=4", "workload.max_prompt_len=128",
                      "workload.max_response_len=48"]
    else:
        device = jax.devices()[0]
        limit = (device.memory_stats() or {}).get("bytes_limit")
        overrides += ["mesh=h100", "hardware=h100", "mesh.chips=1"]
        if limit:  # the plan sizes against this device's memory, not the H100 entry's 80 GB
            overrides.append(f"hardware.hbm_bytes={float(limit)}")
    return compile_plan(compose_config(overrides))


def _prompts(plan, tokenizer, data_dir: Path | None):
    """(prompt_PxW, len_P) of the step's first prompts, as the runtime encodes them."""
    from locojax.data import load_workload, render_prompt
    from locojax.rollout.engine import pad_prompts
    from locojax.runtime.assemble import workload_settings
    from locojax.tokenizers import apply_chat_template

    b, w = plan.batch, plan.workload
    n = b.prompts_per_rollout_host
    if data_dir is not None:
        problems = list(load_workload(workload_settings(w), plan.run.seed).train)[:n]

        def chat(text):
            return apply_chat_template([{"role": "user", "content": text}],
                                       enable_thinking=w.enable_thinking)

        texts = [render_prompt(p, w.prompt_template, chat if w.chat_template else None)
                 for p in problems]
        ids = [x[-b.max_prompt_len:] for x in tokenizer.batch_encode(texts)]
    else:
        log("no GSM8K data: random prompt ids of GSM8K's chat-prompt lengths (mean 83)")
        rng = np.random.default_rng(0)
        lengths = np.clip(rng.normal(83, 30, n).astype(int), 20, b.max_prompt_len)
        ids = [list(rng.integers(1000, 100_000, k)) for k in lengths]
    return pad_prompts(ids, tokenizer.pad_id, length=b.max_prompt_len)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: model=tiny")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--stop-bias", type=float, default=None)
    args = parser.parse_args()
    data_dir = args.data_dir or next((d for d in (REPO.parent / "shared/data/gsm8k",
                                                  REPO / "shared/data/gsm8k") if d.is_dir()),
                                     None)
    import dataclasses

    import jax
    from flax import nnx

    from locojax.model import Qwen3, split_params
    from locojax.rollout.engine import compile_programs, generate_timed
    from locojax.runtime.assemble import (
        engine_options,
        model_arch,
        sampling_settings,
        tokenizer_for,
    )

    plan = _plan(args.tiny, data_dir)
    b = plan.batch
    arch = model_arch(plan.model.config)
    tokenizer = tokenizer_for(plan.model.config, arch.vocab)
    prompts = _prompts(plan, tokenizer, data_dir)
    settings = sampling_settings(plan.sampling, b.response_len, tokenizer)
    bias = args.stop_bias
    if bias is None:
        bias = math.log(arch.vocab / max(1.0, b.response_len / 3))
    settings = dataclasses.replace(settings,
                                   logit_bias=tuple((s, bias) for s in settings.stop_ids))
    options = engine_options(plan.sampling, b.slots, b.prompt_store_rows)
    summary = {"plan": {"device": str(jax.devices()[0].device_kind),
                        "rows": b.prompts_per_rollout_host * b.group_size,
                        "prompt_len": b.max_prompt_len, "response_len": b.response_len,
                        "slots": b.slots, "waves": b.rollout_waves,
                        "rollout_bytes_per_device": b.rollout_bytes_per_device,
                        "stop_bias": round(bias, 3), "data": str(data_dir)}}
    log(f"plan: {summary['plan']}")
    graphdef, params = split_params(Qwen3(arch, rngs=nnx.Rngs(0)))
    key = jax.random.key(0)
    for schedule in ("refill", "static"):
        opts = dataclasses.replace(options, schedule=schedule)
        start = time.perf_counter()
        jax.block_until_ready(generate_timed((graphdef, params), prompts, settings, key,
                                             group_size=b.group_size, options=opts))
        first = time.perf_counter() - start
        start = time.perf_counter()
        r, prefill_s = generate_timed((graphdef, params), prompts, settings, key,
                                      group_size=b.group_size, options=opts)
        lengths = np.asarray(jax.block_until_ready(r).lengths_B)
        seconds = time.perf_counter() - start
        summary[schedule] = {
            "useful_tok_s": round(float(lengths.sum()) / seconds, 1), "seconds": round(seconds, 3),
            "compile_s": round(first - seconds, 2), "prefill_s": round(prefill_s, 4),
            "decode_steps": int(np.asarray(r.stats.decode_steps_R).sum()),
            "idle_share": round(r.stats.idle_share(), 4),
            "mean_length": round(float(lengths.mean()), 1),
            "at_cap": round(float(np.mean(lengths == b.response_len)), 4)}
        log(f"{schedule}: {summary[schedule]}")
    memory = {"plan_bytes": b.rollout_bytes_per_device}
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        memory["peak_bytes_in_use"] = stats["peak_bytes_in_use"]
        memory["peak_over_plan"] = round(stats["peak_bytes_in_use"] / b.rollout_bytes_per_device,
                                         3)
    programs = compile_programs((graphdef, params), prompts, settings, group_size=b.group_size,
                                options=options)
    memory["xla_program_bytes"] = max(
        m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
        - m.alias_size_in_bytes for m in (p.memory_analysis() for p in programs))
    memory["xla_over_plan"] = round(memory["xla_program_bytes"] / b.rollout_bytes_per_device, 3)
    summary["memory"] = memory
    summary["refill_over_static"] = round(summary["refill"]["useful_tok_s"]
                                          / summary["static"]["useful_tok_s"], 3)
    log(f"memory: {memory}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""One accelerator chip: decode, prefill and train step beside the chip's limits.

Every figure stands beside its limit from `conf/hardware/<hw>.yaml` (peak bf16 FLOP/s, HBM
bytes/s), never a matmul timed in this process:

    decode   the plan's `+experiment=gsm8k_co` rollout on this one chip (random weights, GSM8K
             prompts with the real tokenizer, the plan's slots, refill): ms per decode step
             and useful tok/s, beside the step's roofline: the bytes it must read (the bf16
             weights it multiplies, the output matrix included, plus every live slot's real
             KV columns: prompt and tokens so far) over the HBM bandwidth; `kernels` on and
             off (the TPU decode kernel, `locojax.kernels.tpu_decode`)
    prefill  program 1 of the same rollout: the prompt store's forward, model FLOPs (causal
             attention, padded prompt columns) over its seconds, against the peak (MFU)
    train    the GRPO train step at Qwen3 widths (`benchmarks/train_step.py`'s step, fp32
             master, bf16 compute, remat), full and LoRA, `fused` attention on and off:
             model FLOPs (3 x forward: layers, causal attention as computed, the response
             head) over its seconds against the peak (MFU)

Random weights decode until the step cap, so each stop id's logit is raised by ln(V / (T/3))
(lengths roughly geometric with mean ~T/3; `--stop-bias` sets another, the mean is printed).

    python benchmarks/accelerator.py [--parts decode,prefill,train] [--models qwen3_0_6b,...]
        [--prompts 16] [--response 512] [--slots 0] [--data-dir DIR] [--tiny]

`--tiny` (CI, a CPU): model=tiny on the CPU's own entry. The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def hardware_name() -> str:
    """The `conf/hardware` entry of this process's first device (`cpu` on a CPU)."""
    import jax

    from compiler.generations import TPU_GENERATIONS

    kind = jax.devices()[0].device_kind
    gen = TPU_GENERATIONS.get(kind)
    return gen.prefix if gen is not None else "cpu"


def plan_for(args, model: str, response: int, prompts: int):
    """`+experiment=gsm8k_co` for this one device at the benchmark's sizes."""
    from compiler import compile_plan
    from locojax.config.compose import compose_config

    hw = hardware_name()
    overrides = ["+experiment=gsm8k_co", f"model={model}", f"workload.prompts_per_step={prompts}",
                 f"workload.max_response_len={response}", "workload.max_prompt_len=256"]
    overrides += (["mesh=cpu", "mesh.hosts=1", "mesh.devices_per_host=1",
                   "workload.max_prompt_len=128"] if hw == "cpu"
                  else [f"mesh={hw}", "mesh.chips=1"])
    if args.data_dir is not None:
        overrides.append(f"workload.data_dir={args.data_dir}")
    if args.slots:
        overrides.append(f"sampling.slots={args.slots}")
    if model in args.lora_models:  # full fine-tuning's state does not fit one chip
        overrides.append(f"algorithm.lora.rank={args.lora_rank or 16}")
    return compile_plan(compose_config(overrides))


def gsm8k_prompts(plan, tokenizer, data_dir: Path | None):
    """(prompt_PxW, len_P) of the plan's prompts, rendered and encoded as the runtime does;
    without data, random ids of GSM8K's chat-prompt lengths (said on stderr)."""
    from locojax.data import load_workload, render_prompt
    from locojax.rollout.engine import pad_prompts
    from locojax.runtime.assemble import workload_settings
    from locojax.tokenizers import apply_chat_template

    b, w = plan.batch, plan.workload
    n = b.prompts_per_rollout_host
    if data_dir is None:
        log("no GSM8K data: random prompt ids of GSM8K's chat-prompt lengths (mean 83)")
        rng = np.random.default_rng(0)
        lengths = np.clip(rng.normal(83, 30, n).astype(int), 20, b.max_prompt_len)
        ids = [list(rng.integers(1000, 100_000, k)) for k in lengths]
    else:
        problems = list(load_workload(workload_settings(w), plan.run.seed).train)[:n]

        def chat(text):
            return apply_chat_template([{"role": "user", "content": text}],
                                       enable_thinking=w.enable_thinking)

        texts = [render_prompt(p, w.prompt_template, chat) for p in problems]
        ids = [x[-b.max_prompt_len:] for x in tokenizer.batch_encode(texts)]
    return pad_prompts(ids, tokenizer.pad_id, length=b.max_prompt_len)


def hardware_spec(name: str) -> dict:
    """`conf/hardware/<name>.yaml` as a dict (peak FLOP/s, HBM bandwidth)."""
    import yaml

    return yaml.safe_load((REPO / "conf" / "hardware" / f"{name}.yaml").read_text())


def decode_bytes(arch, lengths_B, prompt_len_B, steps: int) -> dict:
    """What one decode step must read on average: the weights it multiplies (bf16 layers,
    final norm and output matrix) and the live KV columns of its slots."""
    from compiler.config import ModelConfig
    from compiler.params import param_count

    fields = ("num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "ffn", "vocab",
              "tie_embeddings")
    total = param_count(ModelConfig(**{k: getattr(arch, k) for k in fields}))
    embed = arch.vocab * arch.hidden
    weights = 2 * (total if arch.tie_embeddings else total - embed)
    kv_token = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * 2
    n = np.maximum(np.asarray(lengths_B, np.int64) - 1, 0)  # decode steps of each row
    live = n * np.asarray(prompt_len_B, np.int64) + n * (n + 1) // 2
    return {"weight_bytes": float(weights),
            "kv_bytes": float(live.sum() * kv_token / max(steps, 1))}


def _rollout_setup(args, model: str):
    """(plan, arch, (graphdef, bf16 params), padded prompts, settings, engine options)."""
    import jax
    from flax import nnx

    from locojax.model import Qwen3, split_params
    from locojax.runtime.assemble import (
        engine_options,
        model_arch,
        sampling_settings,
        tokenizer_for,
    )

    plan = plan_for(args, model, args.response, args.prompts)
    b = plan.batch
    arch = model_arch(plan.model.config)
    arch = dataclasses.replace(arch, param_dtype=arch.dtype)  # the rollout's compute copy
    tokenizer = tokenizer_for(plan.model.config, arch.vocab)
    prompts = gsm8k_prompts(plan, tokenizer, args.data_dir)
    settings = sampling_settings(plan.sampling, b.response_len, tokenizer)
    bias = args.stop_bias if args.stop_bias is not None else math.log(
        arch.vocab / max(1.0, b.response_len / 3))
    settings = dataclasses.replace(settings, logit_bias=tuple((s, bias) for s in settings.stop_ids))
    options = engine_options(plan.sampling, b.slots, b.prompt_store_rows)
    model_state = split_params(Qwen3(arch, rngs=nnx.Rngs(0)))
    jax.block_until_ready(model_state[1])
    return plan, arch, model_state, prompts, settings, options


def _generate(model_state, prompts, settings, plan, options):
    """(rollout, prefill seconds, whole seconds) of one timed call after a compiling one."""
    import jax

    from locojax.rollout.engine import generate_timed

    g = plan.batch.group_size
    jax.block_until_ready(generate_timed(model_state, prompts, settings, jax.random.key(0),
                                         group_size=g, options=options)[0].lengths_B)
    start = time.perf_counter()
    r, prefill_s = generate_timed(model_state, prompts, settings, jax.random.key(0),
                                  group_size=g, options=options)
    jax.block_until_ready(r.lengths_B)
    return r, prefill_s, time.perf_counter() - start


def _decode_row(arch, r, prefill_s: float, seconds: float, hw: dict) -> dict:
    """ms per decode step, useful tok/s and the step's roofline (module docstring)."""
    lengths = np.asarray(r.lengths_B)
    steps = int(np.asarray(r.stats.decode_steps_R).sum())
    decode_s = seconds - prefill_s
    need = decode_bytes(arch, lengths, np.asarray(r.prompt_len_B), steps)
    bytes_step = need["weight_bytes"] + need["kv_bytes"]
    ms = 1e3 * decode_s / max(steps, 1)
    roof_ms = 1e3 * bytes_step / hw["hbm_bytes_per_s"]
    return {"ms_per_step": round(ms, 3), "roofline_ms": round(roof_ms, 3),
            "roofline_fraction": round(roof_ms / ms, 3), "decode_steps": steps,
            "useful_tok_s": round(float(lengths.sum()) / seconds, 1),
            "seconds": round(seconds, 3), "prefill_s": round(prefill_s, 4),
            "idle_share": round(r.stats.idle_share(), 4),
            "mean_length": round(float(lengths.mean()), 1),
            "weight_bytes": need["weight_bytes"], "kv_bytes_per_step": round(need["kv_bytes"])}


def _prefill_row(arch, plan, prefill_s: float, hw: dict) -> dict:
    """MFU of program 1: the prompt store's forward (padded columns, causal attention)."""
    b = plan.batch
    d, h, k, hd, f, n = (arch.hidden, arch.num_heads, arch.num_kv_heads, arch.head_dim,
                         arch.ffn, arch.num_layers)
    prompts, width = b.prompt_store_rows or b.prompts_per_rollout_host, b.max_prompt_len
    layers = 2 * n * (d * (h + 2 * k) * hd + h * hd * d + 3 * d * f) * prompts * width
    attention = 2 * n * prompts * width**2 * h * hd
    flops = layers + attention + 2 * d * arch.vocab * prompts
    return {"seconds": round(prefill_s, 4), "flops": flops,
            "mfu": round(flops / prefill_s / hw["peak_flops_bf16"], 4),
            "prompts": prompts, "width": width}


def agreement(a, b) -> dict:
    """How two rollouts of the same rows and keys agree: rows with identical completions,
    and the largest model log-prob gap over the tokens before a row's first difference."""
    ca, cb = np.asarray(a.completion_BxT), np.asarray(b.completion_BxT)
    same = np.cumprod(ca == cb, axis=1).astype(bool)
    mask = np.asarray(a.mask_BxT) > 0
    gap = np.abs(np.asarray(a.logp_model_BxT) - np.asarray(b.logp_model_BxT))
    return {"identical_rows": float(np.mean(same.all(axis=1))),
            "max_logp_gap": float(np.max(np.where(same & mask, gap, 0.0)))}


def decode_part(args, model: str, hw: dict) -> dict:
    """Decode and prefill of one model at the plan's slots, the TPU kernel on and off."""
    import jax

    plan, arch, state, prompts, settings, options = _rollout_setup(args, model)
    out = {"slots": plan.batch.slots, "rows": plan.batch.prompts_per_rollout_host
           * plan.batch.group_size, "prompt_len": plan.batch.max_prompt_len,
           "response_len": plan.batch.response_len,
           "rollout_bytes_per_device": plan.batch.rollout_bytes_per_device}
    rollouts = []
    for kernels in args.kernels:
        opts = dataclasses.replace(options, tpu_kernels=kernels)
        r, prefill_s, seconds = _generate(state, prompts, settings, plan, opts)
        rollouts.append(r)
        out[f"decode_kernels_{kernels}"] = _decode_row(arch, r, prefill_s, seconds, hw)
        out[f"prefill_kernels_{kernels}"] = _prefill_row(arch, plan, prefill_s, hw)
        log(f"{model} kernels {kernels}: {out[f'decode_kernels_{kernels}']}")
    if len(rollouts) == 2:
        out["kernels_agree"] = agreement(*rollouts)
    stats = jax.devices()[0].memory_stats() or {}
    out["peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
    return out


def _train_args(args, fused: bool, lora: int):
    """The namespace `train_step.run_shape` reads."""
    return argparse.Namespace(rows=args.train_rows, prompt=args.train_prompt,
                              response=args.train_response, keep_probs="auto", remat="block",
                              parts=False, runs=args.runs, peak_size=256 if args.tiny else 2048,
                              fused_attention=fused, lora_rank=lora, compiled=False)


def train_part(args, model: str, hw: dict) -> dict:
    """The GRPO train step of `model`'s widths: full and LoRA, fused attention on and off."""
    import train_step

    from locojax.model.lora import LoraSpec
    from locojax.runtime.assemble import model_arch

    arch = model_arch(plan_for(args, model, args.train_response, 1).model.config)
    out = {}
    for fused in args.fused:
        for lora in (0, args.lora_rank) if args.lora_rank else (0,):
            spec = LoraSpec(rank=lora, alpha=2.0 * lora) if lora else None
            name = f"{'lora' if lora else 'full'}_fused_{fused}"
            row = train_step.run_shape(f"{model} {name}", arch,
                                       _train_args(args, fused == "on", lora), spec)
            mfu = row["flops"] / row["step_s"] / hw["peak_flops_bf16"]
            out[name] = {"step_s": round(row["step_s"], 4), "flops": row["flops"],
                         "mfu": round(mfu, 4), "compiled_bytes": row["compiled_bytes"],
                         "rows": args.train_rows,
                         "tokens": args.train_prompt + args.train_response}
            log(f"{model} train {name}: {out[name]}")
    return out


CO_PHASES = ("rollout_s", "reward_s", "train_s", "step_s")


def _co_run(args, run_dir: Path) -> list[str]:
    """The CO command: `+experiment=gsm8k_co` on this host at the benchmark's sizes
    (`--tiny`: the arithmetic demo's, `+experiment=arith_co`, without its warm-up)."""
    common = [f"run.steps={args.co_steps}", "run.eval_every=0", "run.checkpoint_every=0",
              f"hydra.run.dir={run_dir}"]
    if args.tiny:
        return [sys.executable, "-m", "locojax", "+experiment=arith_co",
                "algorithm.sft_warmup_steps=0", *common]
    cmd = [sys.executable, "-m", "locojax", "+experiment=gsm8k_co",
           f"workload.prompts_per_step={args.co_prompts}",
           f"workload.max_response_len={args.co_response}", *common]
    if args.data_dir is not None:
        cmd.append(f"workload.data_dir={args.data_dir}")
    return cmd


def co_part(args, model: str, hw: dict) -> dict:
    """A CO run of gsm8k_co: each phase's median seconds after the first step beside the
    plan's, the host share of the step, the device's peaks beside the plan's programs, and
    the XLA programs compiled after the first step."""
    import statistics
    import subprocess
    import tempfile

    run_dir = Path(tempfile.mkdtemp(prefix="locojax-co-"))
    cmd = _co_run(args, run_dir) + ([] if model in ("tiny", "qwen3_0_6b") else
                                     [f"model={model}"])
    log(" ".join(cmd))
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    plan = json.loads((run_dir / "plan.json").read_text())
    cost, batch = plan["cost"]["co"], plan["batch"]
    later = rows[1:] or rows
    out = {"steps": len(rows), "first_step_s": round(rows[0]["step_s"], 3),
           "compiles_after_step_1": sum(r.get("compiles", 0) for r in rows[1:])}
    for key in CO_PHASES:
        measured = statistics.median(r[key] for r in later)
        out[key] = {"measured": round(measured, 4), "plan": round(cost[key], 4),
                    "plan_over_measured": round(cost[key] / max(measured, 1e-9), 3)}
    device = sum(statistics.median(r[k] for r in later) for k in ("rollout_s", "train_s"))
    out["host_share"] = {"measured": round(1 - device / out["step_s"]["measured"], 4),
                         "plan": round(cost["host_share"], 4)}
    peaks = {k: max(r.get(k, 0) for r in rows) for k in ("rollout_peak_bytes",
                                                         "device_peak_bytes")}
    out["memory"] = {**peaks, "plan_rollout_bytes": batch["rollout_bytes_per_device"],
                     "plan_train_step_bytes": batch["train_step_bytes_per_device"]}
    log(f"{model} co: {out}")
    return out


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="decode,train,co")
    parser.add_argument("--models", default="qwen3_0_6b")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--response", type=int, default=512)
    parser.add_argument("--slots", type=int, default=0, help="sampling.slots (0: the plan's)")
    parser.add_argument("--kernels", default="auto,off", help="tpu kernels: auto,on,off")
    parser.add_argument("--fused", default="on,off", help="fused training attention: on,off")
    parser.add_argument("--train-rows", type=int, default=16)
    parser.add_argument("--train-prompt", type=int, default=128)
    parser.add_argument("--train-response", type=int, default=384)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-models", default="qwen3_1_7b,qwen3_4b",
                        help="models planned with LoRA (their full state exceeds one chip)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stop-bias", type=float, default=None)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--co-prompts", type=int, default=16)
    parser.add_argument("--co-response", type=int, default=256)
    parser.add_argument("--co-steps", type=int, default=4)
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: model=tiny")
    args = parser.parse_args(argv)
    args.data_dir = args.data_dir or next((d for d in (REPO.parent / "shared/data/gsm8k",
                                                       REPO / "shared/data/gsm8k") if d.is_dir()),
                                          None)
    if args.tiny:
        args.models, args.prompts, args.response = "tiny", 2, 16
        args.train_rows, args.train_prompt, args.train_response, args.runs = 2, 8, 8, 1
        args.co_steps = 2
        args.kernels, args.fused = "auto", "off"  # a CPU runs neither TPU kernel
    args.kernels, args.fused = args.kernels.split(","), args.fused.split(",")
    return args


def main(argv=None) -> None:
    import jax

    args = parse(argv)
    name = hardware_name()
    hw = hardware_spec(name)
    report = {"device": str(jax.devices()[0].device_kind), "hardware": name,
              "peak_flops_bf16": hw["peak_flops_bf16"], "hbm_bytes_per_s": hw["hbm_bytes_per_s"]}
    parts = {"decode": decode_part, "train": train_part, "co": co_part}
    for model in args.models.split(","):
        for part in args.parts.split(","):
            report[f"{model}/{part}"] = parts[part](args, model, hw)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

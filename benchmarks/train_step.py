"""The GRPO train step (loss, backward, AdamW: one jit) in seconds, model FLOPs and MFU.

Shapes (random weights, tied embeddings, vocab 151,936; rows of a 32-token prompt and a
64-token response, 16 rows x 96 tokens unless `--rows`, `--prompt`, `--response` say
otherwise; no KL term, token-mean loss, 1 mini-batch):

    cpu_standard    tiny Qwen3: hidden 256, 4 layers, 4 q / 2 kv heads, head_dim 64, ffn 768
    qwen3_0_6b_2l   Qwen3-0.6B widths: hidden 1024, 16 q / 8 kv heads, head_dim 128, ffn 3072,
                    2 layers (`--layers` changes it; the key then says so)

Model FLOPs per step, counting what the step computes for the loss and its gradient (3x a
forward: the forward and the two backward matmuls), not what remat recomputes:

    6 * P_layers * B * L            layer weight matmuls, P_layers = N (D (H + 2K) hd
                                    + H hd D + 3 D F), every column of every row
    + 12 * N * B * L^2 * H * hd     attention scores and values (dense L x L, as computed)
    + 6 * D * V * B * T             the output head, on the T response columns only

The log-prob head keeps its T x V softmax for the backward where the plan's memory rule
(`compiler.cost.memory.train_step_memory`) says the step then fits the device, as the
runtime does (`--keep-probs auto`). MFU = (model FLOPs / step seconds) / peak, the peak
measured in the same process and the same run: a square matmul of the compute dtype
(2048 x 2048 fp32 on a CPU), timed between the step calls, so a load change on a shared
machine hits both. `hw_flops` adds what the step also runs: the block recompute of remat
and the output head's recompute in backward (when the head recomputes its softmax instead
of keeping it). `--parts` also times the output head (log-probs and their gradient) and the
AdamW update alone, to see where the rest of the step goes.

    .venv/bin/python benchmarks/train_step.py [--runs 5] [--shapes cpu_standard ...]
        [--layers 2] [--dtype float32|bfloat16] [--remat block|none]
        [--keep-probs auto|on|off] [--parts] [--tiny] [--rows 16 --prompt 32 --response 64]
        [--peak-size 2048]

`--tiny` shrinks every shape (CI smoke test). On an accelerator pass `--dtype bfloat16`
(compute; parameters and moments stay fp32) and e.g. `--layers 28`. The last stdout line is
JSON: {"cpu_standard": {"step_s", "flops", "mfu", "compiled_bytes", ...},
"cpu_standard_lora16": {...}, "qwen3_0_6b_2l": {...}, ...}: each shape also as LoRA
(`--lora-rank`, default 16, alpha 2 x rank, all seven block matmuls; 0: none), adapters
trained over the frozen base as the trainer runs it. A LoRA row's `flops` leave out what its
step does not compute, the frozen base's weight gradients (layers and head: one forward's
worth of each), and add the adapters' 6 x adapter parameters x tokens (the cost model's
`compiler.cost.flops.train_flops` rule), so its MFU is comparable with full fine-tuning's; and
`compiled_bytes` is XLA's own figure for the compiled step (arguments, outputs, temporaries).
`compiled_flops` are the compiled step's matmul FLOPs (loops multiplied out) and
`roofline_fraction` = flops / compiled_flops, the efficiency the compiled program allows
(`compiler.cost.roofline`): on a TPU, MFU against the chip's peak over it says how near the
roofline the real chip runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from locojax.config.detect import cpu_only_machine

if not os.environ.get("JAX_PLATFORMS") and cpu_only_machine():
    os.environ["JAX_PLATFORMS"] = "cpu"  # as `mesh=auto`: no libtpu probe on a CPU machine

import jax  # noqa: E402
import jax.numpy as jnp
import numpy as np
from flax import nnx

from compiler.config import DType, ModelConfig
from compiler.cost import memory
from compiler.params import param_count
from compiler.vocab import LossAggregation, Remat
from locojax.aot.hloflops import matmul_flops
from locojax.model import ModelArch, Qwen3, split_params
from locojax.model.lora import LoraSpec
from locojax.train import (
    ForwardSettings,
    GrpoSettings,
    OptimizerSettings,
    TrainBatch,
    init_opt_state,
    make_optimizer,
    make_train_step,
    token_logprobs,
)
from locojax.train.lora import init_adapter_state, lora_split

VOCAB, ROWS, PROMPT, RESPONSE = 151_936, 16, 32, 64
SHAPES = {
    "cpu_standard": dict(num_layers=4, hidden=256, num_heads=4, num_kv_heads=2, head_dim=64,
                         ffn=768),
    "qwen3_0_6b": dict(num_layers=2, hidden=1024, num_heads=16, num_kv_heads=8, head_dim=128,
                       ffn=3072),
}
TINY = dict(hidden=64, num_heads=4, num_kv_heads=2, head_dim=16, ffn=128)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def model_flops(arch: ModelArch, rows: int, length: int, response: int) -> dict[str, float]:
    """Model FLOPs of one step (module docstring) and what remat / head recompute add."""
    d, h, k, hd, f, n = (arch.hidden, arch.num_heads, arch.num_kv_heads, arch.head_dim,
                         arch.ffn, arch.num_layers)
    p_layers = n * (d * (h + 2 * k) * hd + h * hd * d + 3 * d * f)
    layers = 2 * p_layers * rows * length
    attention = 4 * n * rows * length**2 * h * hd
    head = 2 * d * arch.vocab * rows * response
    return {"forward_layers": layers, "forward_attention": attention, "forward_head": head,
            "model": 3 * (layers + attention + head)}


def batch(arch: ModelArch, rows: int, prompt: int, response: int, seed: int = 0) -> TrainBatch:
    """Rows of left-padded prompts and ragged responses, off-policy enough to clip."""
    rng = np.random.default_rng(seed)
    length = prompt + response
    tokens = rng.integers(0, arch.vocab, (rows, length)).astype(np.int32)
    cols = np.arange(length)
    pad = rng.integers(0, prompt // 2, rows)
    ends = prompt + rng.integers(response // 2, response + 1, rows)
    valid = (cols >= pad[:, None]) & (cols < ends[:, None])
    mask = valid & (cols >= prompt)
    positions = np.maximum(cols - pad[:, None], 0).astype(np.int32)
    behaviour = np.where(mask, rng.normal(-12.0, 1.0, (rows, length)), 0.0).astype(np.float32)
    adv = rng.choice([-1.0, 1.0], rows).astype(np.float32)
    return TrainBatch(*(jnp.asarray(x) for x in (tokens, positions, valid, mask, adv,
                                                 behaviour)))


def peak_fn(dtype, size: int):
    """A jitted size x size matmul of `dtype` and its FLOPs."""
    a = jax.random.normal(jax.random.key(1), (size, size), dtype)
    b = jax.random.normal(jax.random.key(2), (size, size), dtype)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, b).block_until_ready()
    return (lambda: mm(a, b).block_until_ready()), 2.0 * size**3


def part_calls(arch: ModelArch, params, opt_state, tx, tokens: int, keep: bool) -> dict:
    """Pieces of the step timed alone: the output head (log-probs and their gradient over
    `tokens` response columns) and the AdamW update of every parameter."""
    k = jax.random.split(jax.random.key(3), 3)
    h = jax.random.normal(k[0], (tokens, arch.hidden), arch.jnp_dtype) * 0.5
    w = jax.random.normal(k[1], (arch.hidden, arch.vocab), jnp.float32) * arch.hidden**-0.5
    t = jax.random.randint(k[2], (tokens,), 0, arch.vocab)
    head = jax.jit(jax.grad(lambda h, w: token_logprobs(h, w, t, keep_probs=keep)[0].sum(),
                            (0, 1)))
    params, opt_state = jax.tree.map(jnp.copy, (params, opt_state))  # the step donates its own
    grads = jax.tree.map(jnp.ones_like, params)
    adamw = jax.jit(lambda p, o, g: tx.update(g, o, p))
    calls = {"head_fwd_bwd": lambda: jax.block_until_ready(head(h, w)),
             "adamw": lambda: jax.block_until_ready(adamw(params, opt_state, grads))}
    for fn in calls.values():
        fn()
    return calls


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def device_bytes() -> float:
    """Memory of the first device (a CPU: the machine's RAM)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return float(stats["bytes_limit"])
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def keeps_probs(arch: ModelArch, rows: int, length: int, response: int, remat: str) -> bool:
    """The plan's rule (`compiler.cost.memory`): keep the head's softmax if the step fits."""
    model = ModelConfig(**{k: getattr(arch, k) for k in (
        "num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "ffn", "vocab",
        "tie_embeddings")}, dtype=DType(arch.dtype), param_dtype=DType(arch.param_dtype))
    step = memory.train_step_memory(
        model, params_per_device=param_count(model), fsdp=1, batch_rows=rows, micro_rows=rows,
        micro_batches=1, seq_len=length, response_len=response, remat=remat == "block",
        keep_probs=True, fused_attention=memory.fused_attention(model, jax.default_backend()))
    return step.total <= memory.TRAIN_STEP_FRACTION * device_bytes()


def _state(arch: ModelArch, settings: GrpoSettings, lora: LoraSpec | None):
    """(step, trained params, opt_state, tx, frozen args): full fine-tuning, or LoRA
    adapters over the frozen base (the base a step argument, as the trainer runs it)."""
    graphdef, params = split_params(Qwen3(arch, rngs=nnx.Rngs(0)))
    tx = make_optimizer(settings.optimizer)
    if lora is None:
        return make_train_step(graphdef, settings), params, init_opt_state(tx, params), tx, ()
    adapters = init_adapter_state(arch, lora, seed=0)
    step = make_train_step(graphdef, settings, split=lora_split(lora))
    return step, adapters, init_opt_state(tx, adapters), tx, (params,)


def compiled_figures(step, *args) -> tuple[float, float]:
    """(bytes, matmul FLOPs) of the compiled step: what XLA allocates, arguments + outputs +
    temporaries (not aliased), from `memory_analysis()` (0 where the backend gives none); the
    dot FLOPs of its optimised HLO with loop bodies multiplied out (`aot.hloflops`)."""
    compiled = step.lower(*args).compile()
    flops = matmul_flops(compiled.as_text())
    stats = compiled.memory_analysis()
    if stats is None:
        return 0.0, flops
    return float(stats.argument_size_in_bytes + stats.output_size_in_bytes
                 + stats.temp_size_in_bytes - stats.alias_size_in_bytes), flops


def _timed_runs(call, parts: dict, arch: ModelArch, args) -> tuple[list, float, dict]:
    """`args.runs` timed steps and parts, each run between two timings of the in-process peak
    matmul: the steps' seconds, the matmul's FLOP/s (median) and each part's seconds."""
    peak_call, peak_flops = peak_fn(arch.jnp_dtype, args.peak_size)
    steps, peaks, part_s = [], [], {k: [] for k in parts}
    for _ in range(args.runs):
        peaks.append(min(timed(peak_call) for _ in range(3)))
        steps.append(timed(call))
        for k, fn in parts.items():
            part_s[k].append(timed(fn))
    peaks.append(min(timed(peak_call) for _ in range(3)))
    return steps, peak_flops / statistics.median(peaks), part_s


def run_shape(name: str, arch: ModelArch, args, lora: LoraSpec | None = None) -> dict:
    rows, prompt, response = args.rows, args.prompt, args.response
    keep = {"on": True, "off": False}.get(args.keep_probs) if args.keep_probs != "auto" else (
        keeps_probs(arch, rows, prompt + response, response, args.remat))
    settings = GrpoSettings(
        aggregation=LossAggregation.token_mean, max_response_len=response,
        forward=ForwardSettings(response_len=response, remat=Remat(args.remat), keep_probs=keep,
                                fused_attention=getattr(args, "fused_attention", False)),
        optimizer=OptimizerSettings(learning_rate=1e-6),
    )
    step, params, opt_state, tx, frozen = _state(arch, settings, lora)
    data = batch(arch, rows, prompt, response)
    state = [params, opt_state]
    memory_bytes, compiled_flops = (compiled_figures(step, params, opt_state, data, *frozen)
                                    if getattr(args, "compiled", True) else (0.0, 0.0))

    def call():
        p, o, m = step(state[0], state[1], data, *frozen)
        jax.block_until_ready((p, o, m))
        state[0], state[1] = p, o

    compile_s = timed(call)
    parts = (part_calls(arch, *state, tx, rows * response, keep) if args.parts and lora is None
             else {})
    steps, peak, part_s = _timed_runs(call, parts, arch, args)
    step_s = statistics.median(steps)
    counts = model_flops(arch, rows, prompt + response, response)
    trainable = sum(x.size for x in jax.tree.leaves(state[0]))
    if lora is not None:  # no weight gradients of the frozen base (layers, head); adapters'
        counts["model"] += (6 * trainable * rows * (prompt + response)
                            - counts["forward_layers"] - counts["forward_head"])
    remat_extra = (counts["forward_layers"] + counts["forward_attention"]
                   if args.remat == "block" else 0)
    hw = counts["model"] + remat_extra + (0 if keep else counts["forward_head"])
    achieved = counts["model"] / step_s
    row = {"step_s": step_s, "flops": counts["model"], "mfu": achieved / peak,
           "flop_s": achieved, "peak_flop_s": peak, "hw_flops": hw, "compile_s": compile_s - step_s,
           "steps_s": steps, "trainable": trainable,
           "compiled_bytes": memory_bytes, "compiled_flops": compiled_flops,
           "roofline_fraction": counts["model"] / compiled_flops if compiled_flops else None,
           "lora": None if lora is None else {"rank": lora.rank, "alpha": lora.alpha,
                                              "targets": list(lora.targets)},
           "shape": {"rows": rows, "tokens": prompt + response, "response": response,
                     **{k: getattr(arch, k) for k in ("num_layers", "hidden", "num_heads",
                                                       "num_kv_heads", "head_dim", "ffn",
                                                       "vocab", "dtype", "param_dtype")}},
           "parts_s": {k: statistics.median(v) for k, v in part_s.items()},
           "remat": args.remat, "keep_probs": keep,
           "fused_attention": getattr(args, "fused_attention", False),
           "peak_matmul": f"{args.peak_size}^2 {arch.dtype}"}
    log(f"{name}: {step_s:.3f} s/step, {counts['model'] / 1e9:.1f} GFLOP, "
        f"{achieved / 1e9:.1f} GFLOP/s of a {peak / 1e9:.1f} GFLOP/s matmul: MFU {row['mfu']:.3f}"
        f" (compile {row['compile_s']:.1f} s)")
    return row


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--shapes", nargs="+", default=["cpu_standard", "qwen3_0_6b"],
                        choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=2, help="layers of the qwen3_0_6b shape")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--remat", default="block", choices=[r.value for r in Remat])
    parser.add_argument("--keep-probs", default="auto", choices=["auto", "on", "off"],
                        help="head keeps its softmax (auto: where the plan's memory rule "
                        "says it fits)")
    parser.add_argument("--parts", action="store_true",
                        help="also time the output head and the AdamW update alone")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--fused-attention", action="store_true",
                        help="the platform's fused attention kernel (TPU: splash)")
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--prompt", type=int, default=PROMPT, help="prompt columns per row")
    parser.add_argument("--response", type=int, default=RESPONSE, help="response columns")
    parser.add_argument("--peak-size", type=int, default=2048,
                        help="side of the square matmul timed as the peak")
    parser.add_argument("--lora-rank", type=int, default=16,
                        help="also time LoRA at this rank on all linear layers (0: no)")
    args = parser.parse_args(argv)
    vocab = VOCAB
    if args.tiny:
        args.rows, args.prompt, args.response, args.peak_size, vocab = 4, 8, 8, 256, 512
    log(f"devices: {jax.devices()}")
    report = {}
    for name in args.shapes:
        shape = dict(SHAPES[name])
        key = name
        if name == "qwen3_0_6b":
            shape["num_layers"] = args.layers
            key = f"qwen3_0_6b_{args.layers}l"
        if args.tiny:
            shape = {**shape, **TINY}
        arch = ModelArch(**shape, vocab=vocab, tie_embeddings=True, dtype=args.dtype,
                         param_dtype="float32")
        report[key] = run_shape(key, arch, args)
        if args.lora_rank:
            spec = LoraSpec(rank=args.lora_rank, alpha=2.0 * args.lora_rank)
            report[f"{key}_lora{args.lora_rank}"] = run_shape(f"{key}_lora{args.lora_rank}",
                                                              arch, args, spec)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()

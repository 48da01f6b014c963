"""Rollout throughput on the standard CPU workload: LoCoJAX next to HF transformers and tunix.

Workload: a tiny Qwen3 (hidden 256, 4 layers, 4 query / 2 kv heads, head_dim 64, ffn 768,
tied embeddings, fp32) with random weights, at vocab 151,936 and 8,192; 16 prompts of 32
random tokens; 64 new tokens each at temperature 1 over the full vocabulary (no top-k/top-p,
no stop token, so every engine generates exactly 16 x 64 tokens per call). The same weights
go to every engine: ours are exported with `locojax.model.export_hf_checkpoint`;
transformers loads that directory (`Qwen3ForCausalLM.from_pretrained`) and tunix reads it
with its own mapping (`tunix.models.qwen3.params.create_model_from_safe_tensors`).

    LoCoJAX:         generate(...) with XLA's ops and with the CPU kernels
                     (`locojax.kernels`, the default on a CPU), both timed; the
                     faster median is reported, the other is in "details".
    HF transformers: generate(do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
                              min_new_tokens=max_new_tokens=64); timed with torch's default
                     threads and with 1 thread, the faster median is reported (on a shared
                     machine 2 OpenMP threads can collapse under load).
    tunix:           Sampler(...)(prompts, temperature=1.0, top_p=1.0) (tunix only samples
                     when top_p is given; 1.0 keeps the full vocabulary).

Each engine lives in its own process, is compiled/warmed up once (compile_s: first call
minus the median steady call), then the engines take turns, one call each per round, for
`--runs` rounds, so a load change on a shared machine hits all of them alike; tok/s is
16 x 64 over the median call. The CPU kernels are built (or loaded from their cache) once
before the engines start; kernel_build_s says how long that took.

Roofline: bytes one decode step must read (every parameter plus the KV cache at the mean
decode length) over a memory bandwidth measured here with a 256 MiB fp32 numpy matrix-vector
product; roofline tok/s = 16 / (bytes / bandwidth).

Peers run in their own interpreter (their pins may clash with ours): the repository's
`.venv-peers`, made once by `make peers`, or LOCOJAX_PEERS_PYTHON (LOCOJAX_HF_PYTHON and
LOCOJAX_TUNIX_PYTHON for one peer; see benchmarks/peers_python.py). A missing or failing peer
is reported on stderr and as null.

Two more cases, same model at the first `--vocab` (151,936 by default):

    grouped:         4 prompts of 256 random tokens x G = 8 samples, 64 new tokens (no stop):
                     LoCoJAX with shared prefill (each prompt prefilled once, its KV copied to
                     its 8 rows) and with the repeated path (32 rows prefilled), prefill seconds
                     (`generate_timed`) and tok/s of each; HF generate(num_return_sequences=8)
                     and tunix on the 32 repeated prompts, tok/s. prefill_speedup = repeated /
                     shared prefill seconds (medians).
    variable_length: 64 prompts of 32 tokens through 16 slots, T = 128, token 1 the stop id with
                     its logit biased by +8.5 + ln(V / 151,936) (lengths roughly geometric; the
                     same stop probability per step at any vocabulary V; measured mean in the
                     JSON): useful tokens/s (each row's tokens up to its stop, the stop included)
                     with schedule=refill and with static (waves of 16), and each one's share
                     of slot-steps spent on finished rows or empty slots.

Run (8-12 minutes on 2 cores):

    .venv/bin/python benchmarks/rollout.py [--runs 7] [--vocab 151936 8192] [--peers hf tunix]
        [--cases standard grouped variable_length] [--smoke]

The last stdout line is JSON: {"vocab_151936": {"locojax": tok_s, "hf": tok_s|null,
"tunix": tok_s|null, "roofline_fraction": f, "compile_s": s, ...}, "vocab_8192": {...},
"grouped": {"shared_prefill_s", "repeated_prefill_s", "prefill_speedup", "locojax": tok_s,
"hf": tok_s|null, "tunix": tok_s|null, ...}, "variable_length": {"refill": tok_s,
"static": tok_s, "speedup", "mean_length", ...}}.
Internally each engine runs as `PY benchmarks/rollout.py --serve NAME --dir D`, which warms
up, prints one JSON line, then answers each `run` line on stdin with one timed call.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a CPU benchmark: never loads libtpu

import numpy as np  # noqa: E402
from child_env import child_env  # noqa: E402
from peers_python import peer_python
from tunix_qwen3 import tunix_config

PROMPTS, PROMPT_LEN, NEW_TOKENS = 16, 32, 64
ARCH = dict(num_layers=4, hidden=256, num_heads=4, num_kv_heads=2, head_dim=64, ffn=768)
STANDARD = dict(prompts=PROMPTS, prompt_len=PROMPT_LEN, group=1, new_tokens=NEW_TOKENS)
GROUPED = dict(prompts=4, prompt_len=256, group=8, new_tokens=64)
VARIABLE = dict(prompts=64, prompt_len=32, group=1, new_tokens=128, slots=16, stop_id=1,
                stop_bias=8.5)
"""The cases' work; the stop bias makes a step end a row with probability ~1/32 here."""
SMOKE_ARCH = dict(num_layers=1, hidden=64, num_heads=4, num_kv_heads=2, head_dim=16, ffn=128)
SMOKE_GROUPED = GROUPED | dict(prompt_len=64, new_tokens=16)
SMOKE_VARIABLE = VARIABLE | dict(prompts=16, new_tokens=32, slots=4)
"""`--smoke` (the test suite's): every case's pipeline on a 1-layer, 64-wide model at a few rows
(16 rows of 32 through 4 slots: the stop still ends ~64% of them early); figures meaningless."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ---- engines: each returns {variant: call()} after loading; calls block until done ----


def _case(workdir: Path) -> dict:
    return json.loads((workdir / "case.json").read_text())


def load_locojax(workdir: Path) -> dict:
    import jax

    from locojax.kernels import cpu as cpu_kernels
    from locojax.model import abstract_model, load_hf_checkpoint
    from locojax.rollout.engine import EngineOptions, generate_timed
    from locojax.rollout.sampler import SamplingSettings

    case = _case(workdir)
    arch, params = load_hf_checkpoint(workdir / "ckpt")
    graphdef, _ = abstract_model(arch)
    prompts = np.load(workdir / "prompts.npy")
    lens = np.full(len(prompts), prompts.shape[1], np.int32)
    stop = case.get("stop_id")
    settings = SamplingSettings(
        temperature=1.0, max_new_tokens=case["new_tokens"],
        stop_ids=() if stop is None else (stop,),
        logit_bias=() if stop is None else ((stop, case["stop_bias"]),))
    rows = len(prompts) * case["group"]

    def call_with(**options):
        opts = EngineOptions(**options)
        # Keys made here, not in the timed call (indexing a key array is a dispatch, ~0.5 ms);
        # call i of every variant draws with key i: the same rows, the same tokens.
        keys = iter([jax.random.key(seed) for seed in range(1_000)])

        def call():
            r, prefill_s = generate_timed((graphdef, params), (prompts, lens), settings,
                                          next(keys), group_size=case["group"], options=opts)
            lengths = np.asarray(jax.block_until_ready(r).lengths_B)
            if stop is None:
                assert int(lengths.min()) == case["new_tokens"]
            return {"prefill_s": prefill_s, "tokens": int(lengths.sum()),
                    "mean_length": float(lengths.mean()), "idle_share": r.stats.idle_share()}

        return call

    if stop is not None:  # variable_length: the schedules (XLA's ops or kernels, as auto picks)
        return {"refill": call_with(slots=case["slots"], schedule="refill"),
                "static": call_with(slots=case["slots"], schedule="static")}
    if case["group"] > 1:  # grouped: one prefill per prompt vs one per row
        return {"shared": call_with(prefill="shared"), "repeated": call_with(prefill="repeated")}
    variants = {"xla ops": call_with(cpu_kernels="off")}
    if cpu_kernels.available():  # built by the parent (kernel_build_seconds): cached
        variants["cpu kernels"] = call_with(cpu_kernels="on")
    assert rows == PROMPTS
    return variants


def load_hf(workdir: Path) -> dict:
    import torch
    from transformers import Qwen3ForCausalLM

    case = _case(workdir)
    model = Qwen3ForCausalLM.from_pretrained(workdir / "ckpt", dtype=torch.float32).eval()
    ids = torch.from_numpy(np.load(workdir / "prompts.npy")).long()
    new = case["new_tokens"]
    kwargs = dict(
        attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, top_p=1.0,
        temperature=1.0, max_new_tokens=new, min_new_tokens=new,
        num_return_sequences=case["group"], pad_token_id=0, eos_token_id=None,
    )
    shape = (len(ids) * case["group"], ids.shape[1] + new)
    torch.manual_seed(0)
    default_threads = torch.get_num_threads()

    def call_with(threads: int):
        def call():
            torch.set_num_threads(threads)
            with torch.no_grad():
                out = model.generate(ids, **kwargs)
            assert tuple(out.shape) == shape, out.shape

        return call

    variants = {f"threads={default_threads}": call_with(default_threads)}
    if default_threads != 1:
        variants["threads=1"] = call_with(1)
    return variants


class _IdTokenizer:
    """Token ids written as space-separated integers: tunix's Sampler takes strings."""

    def encode(self, text: str, **_) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, **_) -> str:
        return " ".join(str(int(t)) for t in ids)

    def bos_id(self):
        return None

    def eos_id(self) -> int:
        return -1

    def pad_id(self) -> int:
        return 0


def load_tunix(workdir: Path) -> dict:
    import jax
    from tunix.generate import sampler as sampler_lib
    from tunix.models.qwen3 import params as params_lib

    config = tunix_config(workdir / "ckpt")
    auto = (jax.sharding.AxisType.Auto,) * 2  # tunix's gathers fail under explicit axes
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=auto)
    model = params_lib.create_model_from_safe_tensors(str(workdir / "ckpt"), config, mesh)
    case = _case(workdir)
    new, width = case["new_tokens"], case["prompt_len"]
    cache = sampler_lib.CacheConfig(
        cache_size=width + new, num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
    )
    sampler = sampler_lib.Sampler(model, _IdTokenizer(), cache)
    # tunix samples one completion per prompt: a group is its prompt repeated G times.
    texts = [" ".join(map(str, row)) for row in np.load(workdir / "prompts.npy")
             for _ in range(case["group"])]
    seeds = iter(range(10_000))

    def call():
        out = sampler(texts, max_generation_steps=new, max_prompt_length=width,
                      temperature=1.0, top_p=1.0, eos_tokens=[-1], seed=next(seeds))
        assert all(len(t) == new for t in out.tokens), [len(t) for t in out.tokens]

    return {"": call}


LOADERS = {"locojax": load_locojax, "hf": load_hf, "tunix": load_tunix}


def _timed(call) -> dict:
    """{"s": seconds of the call, **what the call returned (e.g. its prefill seconds)}."""
    start = time.perf_counter()
    extra = call() or {}
    return {"s": time.perf_counter() - start, **extra}


def serve(name: str, workdir: Path) -> None:
    """Warm up, print {variant: first call}, then time one call per `run` line."""
    variants = LOADERS[name](workdir)
    print(json.dumps({v: _timed(call) for v, call in variants.items()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        print(json.dumps({v: _timed(call) for v, call in variants.items()}), flush=True)


class Engine:
    """One engine in its own process, driven line by line."""

    def __init__(self, name: str, python: str, workdir: Path):
        env = child_env(JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
        self.name = name
        self.log = workdir / f"{name}.log"  # a file: a full stderr pipe would block the peer
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(
                [python, __file__, "--serve", name, "--dir", str(workdir)], env=env,
                text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            )
        self.first = {v: r["s"] for v, r in self._reply().items()}
        self.times: dict[str, list[float]] = {v: [] for v in self.first}
        self.extras: dict[str, list[dict]] = {v: [] for v in self.first}

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            err = self.log.read_text()[-3000:]
            raise RuntimeError(f"{self.name} exited ({self.proc.wait()}):\n{err}")
        return json.loads(line)

    def run(self) -> None:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        for variant, reply in self._reply().items():
            self.times[variant].append(reply.pop("s"))
            self.extras[variant].append(reply)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)

    def median(self, variant: str, key: str | None = None) -> float:
        """Median seconds of a variant's calls, or of one of the figures they returned."""
        if key is None:
            return statistics.median(self.times[variant])
        return statistics.median(e[key] for e in self.extras[variant])

    def summary(self, tokens: int = PROMPTS * NEW_TOKENS) -> dict:
        """Best variant by median: tok/s, compile seconds, and every variant's times."""
        medians = {v: statistics.median(t) for v, t in self.times.items()}
        best = min(medians, key=medians.get)
        return {
            "tok_s": tokens / medians[best],
            "variant": best,
            "compile_s": max(self.first[best] - medians[best], 0.0),
            "min_tok_s": tokens / min(self.times[best]),
            "times_s": {v: [round(s, 4) for s in t] for v, t in self.times.items()},
        }


def start_engine(name: str, workdir: Path) -> Engine | None:
    """The engine's process, warmed up; None with the reason on stderr if it cannot run."""
    if name == "locojax":
        python = sys.executable
    else:
        python = str(peer_python(name))
        if not Path(python).exists():
            log(f"{name}: skipped, {python} not found (`make peers`, or LOCOJAX_PEERS_PYTHON)")
            return None
    try:
        return Engine(name, python, workdir)
    except RuntimeError as err:
        if name == "locojax":
            raise
        log(f"{name}: skipped, it failed to start: {err}")
        return None


# ---- roofline ----


def bandwidth_bytes_per_s() -> float:
    """Read bandwidth of a 256 MiB fp32 matrix-vector product (best of 5)."""
    a = np.random.default_rng(0).standard_normal((4096, 16384), dtype=np.float32)
    x = np.ones(16384, np.float32)
    return a.nbytes / min(_seconds(lambda: a @ x) for _ in range(6))


def decode_bytes(vocab: int) -> float:
    """Bytes one decode step reads: every parameter plus the KV cache at the mean length."""
    d, f, h, k, hd, n = (ARCH[x] for x in ("hidden", "ffn", "num_heads", "num_kv_heads",
                                           "head_dim", "num_layers"))
    layer = d * hd * (2 * h + 2 * k) + 3 * d * f + 2 * d + 2 * hd
    params = vocab * d + n * layer + d
    kv = 2 * n * PROMPTS * (PROMPT_LEN + NEW_TOKENS / 2) * k * hd
    return 4.0 * (params + kv)


def write_workload(vocab: int, workdir: Path, case: dict = STANDARD) -> None:
    """Random weights (seed 0) as an HF checkpoint, the case's random prompt ids (seed 1)."""
    from flax import nnx

    from locojax.model import ModelArch, Qwen3, export_hf_checkpoint, split_params

    arch = ModelArch(**ARCH, vocab=vocab, tie_embeddings=True, dtype="float32")
    _, params = split_params(Qwen3(arch, rngs=nnx.Rngs(0)))
    export_hf_checkpoint(arch, params, workdir / "ckpt")
    prompts = np.random.default_rng(1).integers(2, vocab, (case["prompts"], case["prompt_len"]),
                                                np.int32)
    np.save(workdir / "prompts.npy", prompts)
    (workdir / "case.json").write_text(json.dumps(case))


def run_engines(names: list[str], workdir: Path, runs: int) -> dict:
    """Start each engine (one at a time, so compiles do not overlap), then take turns."""
    engines = {}
    try:
        for name in names:
            engines[name] = start_engine(name, workdir)
        live = [e for e in engines.values() if e is not None]
        for _ in range(runs):
            for engine in live:
                engine.run()
                time.sleep(0.2)  # let OpenMP spinners of the previous engine settle
    finally:
        for engine in engines.values():
            if engine is not None:
                engine.close()
    return engines


def kernel_build_seconds() -> float | None:
    """Seconds to build (or load from their cache) the CPU kernels; None if unavailable.

    Done here once, so the engine processes load it from the cache and their compile_s is
    XLA's alone; a fresh machine pays the build (~3 s) once.
    """
    from locojax.kernels import cpu as cpu_kernels

    start = time.perf_counter()
    ready = cpu_kernels.available()
    seconds = time.perf_counter() - start
    log(f"CPU kernels: {'ready' if ready else 'unavailable'} after {seconds:.1f} s"
        + ("" if ready else f" ({cpu_kernels.unavailable_reason()})"))
    return round(seconds, 2) if ready else None


def bench_vocab(vocab: int, runs: int, peers: list[str], bandwidth: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        write_workload(vocab, workdir)
        engines = run_engines(["locojax", *peers], workdir, runs)
    stats = {name: e.summary() if e else None for name, e in engines.items()}
    roofline = PROMPTS / (decode_bytes(vocab) / bandwidth)
    ours = stats["locojax"]
    for name, s in stats.items():
        if s:
            log(f"vocab {vocab}: {name:8s} {s['tok_s']:7.0f} tok/s  compile/warm-up "
                f"{s['compile_s']:.1f} s  {s['variant']}")
    log(f"vocab {vocab}: roofline {roofline:.0f} tok/s, locojax at "
        f"{ours['tok_s'] / roofline:.0%}")
    tok_s = {name: round(s["tok_s"], 1) if s else None for name, s in stats.items()}
    return {
        "locojax": tok_s["locojax"],
        "hf": tok_s.get("hf"),
        "tunix": tok_s.get("tunix"),
        "roofline_fraction": round(ours["tok_s"] / roofline, 3),
        "compile_s": round(ours["compile_s"], 2),
        "roofline_tok_s": round(roofline, 1),
        "bandwidth_gb_s": round(bandwidth / 1e9, 2),
        "details": {name: s for name, s in stats.items() if s},
    }


def bench_grouped(runs: int, peers: list[str], vocab: int) -> dict:
    """Shared prefill vs the repeated path (same run), and the peers on the same 32 rows."""
    case = GROUPED
    tokens = case["prompts"] * case["group"] * case["new_tokens"]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        write_workload(vocab, workdir, case)
        engines = run_engines(["locojax", *peers], workdir, runs)
    ours = engines["locojax"]
    shared_s, repeated_s = (ours.median(v, "prefill_s") for v in ("shared", "repeated"))
    tok_s = {v: tokens / ours.median(v) for v in ("shared", "repeated")}
    peer_tok_s = {name: round(e.summary(tokens)["tok_s"], 1) if e else None
                  for name, e in engines.items() if name != "locojax"}
    log(f"grouped: prefill shared {shared_s * 1e3:.0f} ms, repeated {repeated_s * 1e3:.0f} ms "
        f"({repeated_s / shared_s:.1f}x); tok/s shared {tok_s['shared']:.0f}, repeated "
        f"{tok_s['repeated']:.0f}, " + ", ".join(f"{k} {v}" for k, v in peer_tok_s.items()))
    return {
        "shared_prefill_s": round(shared_s, 4), "repeated_prefill_s": round(repeated_s, 4),
        "prefill_speedup": round(repeated_s / shared_s, 2),
        "locojax": round(tok_s["shared"], 1), "locojax_repeated": round(tok_s["repeated"], 1),
        "hf": peer_tok_s.get("hf"), "tunix": peer_tok_s.get("tunix"),
        "details": {name: e.summary(tokens) for name, e in engines.items() if e},
    }


def bench_variable(runs: int, vocab: int) -> dict:
    """Useful tokens/s through 16 slots, refilled vs static waves, in the same run."""
    # The same stop probability per step at any vocabulary: random logits are ~N(0, 1) each.
    case = VARIABLE | dict(stop_bias=round(VARIABLE["stop_bias"] + math.log(vocab / 151_936), 3))
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        write_workload(vocab, workdir, case)
        ours = run_engines(["locojax"], workdir, runs)["locojax"]
    # Same keys for both schedules in every round: the same rows, so the same useful tokens.
    useful = {v: statistics.median(e["tokens"] / t for e, t in zip(
        ours.extras[v], ours.times[v], strict=True)) for v in ("refill", "static")}
    mean_length = statistics.mean(e["mean_length"] for e in ours.extras["refill"])
    idle = {v: round(ours.median(v, "idle_share"), 3) for v in ("refill", "static")}
    log(f"variable_length: useful tok/s refill {useful['refill']:.0f}, static "
        f"{useful['static']:.0f} ({useful['refill'] / useful['static']:.2f}x); mean length "
        f"{mean_length:.1f} of {case['new_tokens']}; idle slot-steps {idle}")
    return {
        "refill": round(useful["refill"], 1), "static": round(useful["static"], 1),
        "speedup": round(useful["refill"] / useful["static"], 2),
        "mean_length": round(mean_length, 2), "stop_bias": case["stop_bias"],
        "idle_share": idle, "details": {"locojax": ours.summary()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[151_936, 8_192])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--peers", nargs="*", choices=["hf", "tunix"], default=["hf", "tunix"],
                        help="peers to run next to LoCoJAX (none: `--peers`)")
    parser.add_argument("--cases", nargs="+", choices=["standard", "grouped", "variable_length"],
                        default=["standard", "grouped", "variable_length"])
    parser.add_argument("--smoke", action="store_true",
                        help="the cases at plumbing size (SMOKE_ARCH): the test suite's")
    parser.add_argument("--serve", choices=sorted(LOADERS), help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.dir)
        return
    if args.smoke:  # the engines read the model and the case from their directory
        global ARCH, GROUPED, VARIABLE
        ARCH, GROUPED, VARIABLE = SMOKE_ARCH, SMOKE_GROUPED, SMOKE_VARIABLE
    bandwidth = bandwidth_bytes_per_s()
    log(f"memory bandwidth (numpy matrix-vector): {bandwidth / 1e9:.1f} GB/s; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    kernel_s = kernel_build_seconds()
    report = {}
    if "standard" in args.cases:
        report |= {f"vocab_{v}": bench_vocab(v, args.runs, args.peers, bandwidth) | {
            "kernel_build_s": kernel_s} for v in args.vocab}
    if "grouped" in args.cases:
        report["grouped"] = bench_grouped(args.runs, args.peers, args.vocab[0])
    if "variable_length" in args.cases:
        report["variable_length"] = bench_variable(args.runs, args.vocab[0])
    print(json.dumps(report))


if __name__ == "__main__":
    main()

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

Run (3-6 minutes on 2 cores):

    .venv/bin/python benchmarks/rollout.py [--runs 7] [--vocab 151936 8192] [--peers hf tunix]

The last stdout line is JSON: {"vocab_151936": {"locojax": tok_s, "hf": tok_s|null,
"tunix": tok_s|null, "roofline_fraction": f, "compile_s": s, ...}, "vocab_8192": {...}}.
Internally each engine runs as `PY benchmarks/rollout.py --serve NAME --dir D`, which warms
up, prints one JSON line, then answers each `run` line on stdin with one timed call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from peers_python import peer_python

PROMPTS, PROMPT_LEN, NEW_TOKENS = 16, 32, 64
ARCH = dict(num_layers=4, hidden=256, num_heads=4, num_kv_heads=2, head_dim=64, ffn=768)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ---- engines: each returns {variant: call()} after loading; calls block until done ----


def load_locojax(workdir: Path) -> dict:
    import jax

    from locojax.kernels import cpu as cpu_kernels
    from locojax.model import abstract_model, load_hf_checkpoint
    from locojax.rollout.engine import generate
    from locojax.rollout.sampler import SamplingSettings

    arch, params = load_hf_checkpoint(workdir / "ckpt")
    graphdef, _ = abstract_model(arch)
    prompts = np.load(workdir / "prompts.npy")
    lens = np.full(len(prompts), prompts.shape[1], np.int32)
    settings = SamplingSettings(temperature=1.0, max_new_tokens=NEW_TOKENS)
    # Keys made here, not in the timed call (indexing a key array is a dispatch, ~0.5 ms).
    keys = iter([jax.random.key(seed) for seed in range(1_000)])

    kernel = cpu_kernels.available()  # built by the parent (kernel_build_seconds): cached

    def call_with(kernels: str):
        def call():
            r = generate((graphdef, params), (prompts, lens), settings, next(keys),
                         cpu_kernels=kernels)
            assert int(jax.block_until_ready(r).lengths_B.min()) == NEW_TOKENS

        return call

    variants = {"xla ops": call_with("off")}
    if kernel:
        variants["cpu kernels"] = call_with("on")
    return variants


def load_hf(workdir: Path) -> dict:
    import torch
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(workdir / "ckpt", dtype=torch.float32).eval()
    ids = torch.from_numpy(np.load(workdir / "prompts.npy")).long()
    kwargs = dict(
        attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, top_p=1.0,
        temperature=1.0, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
        pad_token_id=0, eos_token_id=None,
    )
    torch.manual_seed(0)
    default_threads = torch.get_num_threads()

    def call_with(threads: int):
        def call():
            torch.set_num_threads(threads)
            with torch.no_grad():
                out = model.generate(ids, **kwargs)
            assert out.shape == (PROMPTS, PROMPT_LEN + NEW_TOKENS), out.shape

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
    from tunix.models.qwen3 import model as model_lib
    from tunix.models.qwen3 import params as params_lib

    cfg = json.loads((workdir / "ckpt" / "config.json").read_text())
    config = model_lib.ModelConfig(
        num_layers=cfg["num_hidden_layers"], vocab_size=cfg["vocab_size"],
        embed_dim=cfg["hidden_size"], hidden_dim=cfg["intermediate_size"],
        num_heads=cfg["num_attention_heads"], head_dim=cfg["head_dim"],
        num_kv_heads=cfg["num_key_value_heads"], rope_theta=int(cfg["rope_theta"]),
        norm_eps=cfg["rms_norm_eps"], use_tied_embedding=cfg["tie_word_embeddings"],
    )
    auto = (jax.sharding.AxisType.Auto,) * 2  # tunix's gathers fail under explicit axes
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=auto)
    model = params_lib.create_model_from_safe_tensors(str(workdir / "ckpt"), config, mesh)
    cache = sampler_lib.CacheConfig(
        cache_size=PROMPT_LEN + NEW_TOKENS, num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
    )
    sampler = sampler_lib.Sampler(model, _IdTokenizer(), cache)
    texts = [" ".join(map(str, row)) for row in np.load(workdir / "prompts.npy")]
    seeds = iter(range(10_000))

    def call():
        out = sampler(texts, max_generation_steps=NEW_TOKENS, max_prompt_length=PROMPT_LEN,
                      temperature=1.0, top_p=1.0, eos_tokens=[-1], seed=next(seeds))
        assert all(len(t) == NEW_TOKENS for t in out.tokens), [len(t) for t in out.tokens]

    return {"": call}


LOADERS = {"locojax": load_locojax, "hf": load_hf, "tunix": load_tunix}


def serve(name: str, workdir: Path) -> None:
    """Warm up, print {variant: first-call seconds}, then time one call per `run` line."""
    variants = LOADERS[name](workdir)
    print(json.dumps({v: _seconds(call) for v, call in variants.items()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        print(json.dumps({v: _seconds(call) for v, call in variants.items()}), flush=True)


class Engine:
    """One engine in its own process, driven line by line."""

    def __init__(self, name: str, python: str, workdir: Path):
        env = os.environ | {"JAX_PLATFORMS": "cpu", "TOKENIZERS_PARALLELISM": "false"}
        env.pop("XLA_FLAGS", None)
        self.name = name
        self.log = workdir / f"{name}.log"  # a file: a full stderr pipe would block the peer
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(
                [python, __file__, "--serve", name, "--dir", str(workdir)], env=env,
                text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            )
        self.first = self._reply()
        self.times: dict[str, list[float]] = {v: [] for v in self.first}

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            err = self.log.read_text()[-3000:]
            raise RuntimeError(f"{self.name} exited ({self.proc.wait()}):\n{err}")
        return json.loads(line)

    def run(self) -> None:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        for variant, seconds in self._reply().items():
            self.times[variant].append(seconds)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)

    def summary(self) -> dict:
        """Best variant by median: tok/s, compile seconds, and every variant's times."""
        medians = {v: statistics.median(t) for v, t in self.times.items()}
        best = min(medians, key=medians.get)
        return {
            "tok_s": PROMPTS * NEW_TOKENS / medians[best],
            "variant": best,
            "compile_s": max(self.first[best] - medians[best], 0.0),
            "min_tok_s": PROMPTS * NEW_TOKENS / min(self.times[best]),
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


def write_workload(vocab: int, workdir: Path) -> None:
    """Random weights (seed 0) as an HF checkpoint, and 16 x 32 random prompt ids."""
    from flax import nnx

    from locojax.model import ModelArch, Qwen3, export_hf_checkpoint, split_params

    arch = ModelArch(**ARCH, vocab=vocab, tie_embeddings=True, dtype="float32")
    _, params = split_params(Qwen3(arch, rngs=nnx.Rngs(0)))
    export_hf_checkpoint(arch, params, workdir / "ckpt")
    prompts = np.random.default_rng(1).integers(1, vocab, (PROMPTS, PROMPT_LEN), np.int32)
    np.save(workdir / "prompts.npy", prompts)


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
        names = ["locojax", *peers]
        engines = {}
        try:
            for name in names:  # one at a time, so compiles do not overlap
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[151_936, 8_192])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--peers", nargs="*", choices=["hf", "tunix"], default=["hf", "tunix"],
                        help="peers to run next to LoCoJAX (none: `--peers`)")
    parser.add_argument("--serve", choices=sorted(LOADERS), help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.dir)
        return
    bandwidth = bandwidth_bytes_per_s()
    log(f"memory bandwidth (numpy matrix-vector): {bandwidth / 1e9:.1f} GB/s; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    kernel_s = kernel_build_seconds()
    report = {f"vocab_{v}": bench_vocab(v, args.runs, args.peers, bandwidth) | {
        "kernel_build_s": kernel_s} for v in args.vocab}
    print(json.dumps(report))


if __name__ == "__main__":
    main()

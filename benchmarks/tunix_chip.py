"""google-tunix 0.1.7 on one accelerator: its Sampler and its GRPOLearner at LoCoJAX's shapes.

One process, JAX on whatever device is there (a TPU v5e chip; the CPU with `--tiny`), tunix's own
code paths, tuned as a careful user would tune them:

- model: tunix's Qwen3 (`tunix.models.qwen3.model.Qwen3`), random weights from its own
  initialisers (drawn on the device under a (1, 1) ("fsdp", "tp") mesh), Qwen3-0.6B widths (hidden
  1024, 28 layers, 16 q / 8 kv heads, head_dim 128, ffn 3072, vocab 151,936, tied), bf16 compute
  and bf16 parameters (`--param-dtype`; AdamW's moments follow them): fp32 parameters, moments
  and gradient accumulator alone take 8.9 GiB of the v5e's 15.75, before the rollout's cache (which
  tunix's decode loop holds twice) or the train step's own. tunix's MLP kernels start at zero: the
  same FLOPs and bytes.
- stop: random weights almost never sample a stop id, so the stop ids' logits (<|im_end|>,
  <|endoftext|>) are raised by `--stop-bias` (default ln(V / (T / 3)) as benchmarks/rollout_gpu.py:
  lengths roughly geometric, mean ~T / 3; `none`: every row runs to the cap), in one-token calls
  (the sampler's decode steps) only, so prefill and training run tunix's programs unchanged.
- prompts: `--prompts-file` (JSON token ids, e.g. GSM8K rendered with the Qwen3 chat template:
  `--write-prompts` makes one from ../shared/data/gsm8k in LoCoJAX's venv); without one, random ids
  of GSM8K chat-prompt lengths (mean 83). Left-padded to `--prompt-len` with <|endoftext|>; the
  tokenizer handed to tunix reads and writes ids as text (no vocabulary work on the host).

(a) Sampler (`tunix.generate.sampler.Sampler`): KV cache exactly prompt + new tokens,
    `max_prompt_length` = the padded width (one compile), temperature 1, `top_p=1.0`, `top_k=None`
    (the full vocabulary; tunix then draws with one `jax.random.categorical`), `echo=False`,
    `return_logits=False`, stop ids as `eos_tokens`; N prompts x G samples (a prompt repeated G
    times, as tunix's GRPO does) in calls of `--rollout-rows` rows (halved on an out-of-memory
    error; tunix's decode reads the whole cache width of every row at every step, so rows a call
    barely change its tokens/s; the v5e compiler puts its decode program at 7.7 GiB for 64 rows x
    512 columns, 15.4 GiB for 128: it copies the cache). The first call is compile + run; then
    `--runs` timed passes over every row (the median pass is reported). Useful tokens: each row's
    tokens up to its stop (the stop included) or the cap. Prefill and the decode loop (one jitted
    `while_loop`) are timed apart by wrapping the sampler's two jitted programs; decode steps = the
    loop's iterations (it runs until every row of the call has stopped, or the cap): ms per decode
    step = decode seconds / steps; slot_tok_s counts every row at every step, stopped or not.
(b) GRPOLearner (`tunix.rl.grpo.grpo_learner`, `tunix.rl.rl_cluster`): actor, rollout and (unused)
    reference colocated on one mesh, so the rollout reads the actor's own weights (no copy, no
    sync); the rollout is tunix's VanillaRollout with the settings of (a), `--rollout-rows` rows a
    call (its rollout micro-batch), handed in through `ClusterConfig.rollout_engine`: the actor's
    Variables under a graphdef without remat, since tunix's `nnx.remat` inside the sampler's decode
    `while_loop` raises flax's TraceContextError (flax 0.12.8). GRPOConfig(num_generations=G,
    num_iterations=1, beta=0 (no reference pass), epsilon=0.2, loss_agg_mode="token-mean"); optax
    clip_by_global_norm(1) + adamw(`--lr`); one optimizer update per step (mini-batch = the step's
    N prompts), gradients accumulated over micro-batches of `--train-micro` prompts (G rows each),
    decoder-layer remat in training (`--remat`; the v5e compiler puts tunix's train step of 8 rows x
    512 tokens at 8.9 GiB with it, 14.2 GiB without). Reward: uniform random in [0, 1) from a seeded
    numpy generator (no scoring cost; nonzero advantages). `--steps` whole steps (rollout + reward +
    advantages + train) on fresh prompts; each step's seconds and its split (rollout, reward, train,
    other = advantages and host work), timed by wrapping `RLCluster.generate`, the reward manager
    and `RLCluster.update_actor` (the last micro-batch of a step blocks on the parameters). The
    first step includes the train step's compile; the rollout's programs are (a)'s, loaded from a
    fresh persistent compilation cache (same shapes) instead of compiled twice.
(c) the device's peak memory (`memory_stats()`, where the device reports it) after (a) and (b).

Chip (Qwen3-0.6B, 16 prompts x 8, 256 + 256 tokens, 3 GRPO steps; mostly XLA compiles: tunix
unrolls its 28 layers):

    python3 benchmarks/tunix_chip.py --prompts-file P.json

CPU smoke (tiny widths, a minute or two of CPU): `python3 benchmarks/tunix_chip.py --tiny`.
Each part's JSON goes to stderr as it ends; the last stdout line is JSON: {"device", "settings",
"sampler": {...}, "grpo": {...}, "memory": {...}, "versions": {...}}; a part that fails gives
{"error": ...} and the rest still runs.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PAD_ID = 151643  # <|endoftext|>: Qwen3's pad token, also a stop id
STOP_IDS = (151645, 151643)  # <|im_end|>, <|endoftext|>


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny widths, few tokens")
    p.add_argument("--prompts-file", type=Path, default=None)
    p.add_argument("--prompts", type=int, default=16, help="N prompts per call set / GRPO step")
    p.add_argument("--group", type=int, default=8, help="G samples per prompt")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=256, help="cap on new tokens")
    p.add_argument("--rollout-rows", type=int, default=64,
                   help="rows a Sampler call: (a)'s calls and (b)'s rollout micro-batch")
    p.add_argument("--runs", type=int, default=2, help="(a)'s timed passes after the compile")
    p.add_argument("--stop-bias", default="auto", help="auto, none or a float")
    p.add_argument("--steps", type=int, default=3, help="(b)'s GRPO steps (first compiles)")
    p.add_argument("--grpo-new-tokens", type=int, default=0, help="(b)'s cap (0: --new-tokens)")
    p.add_argument("--train-micro", type=int, default=1, help="prompts a training micro-batch")
    p.add_argument("--remat", choices=["none", "block", "decoder"], default="decoder")
    p.add_argument("--param-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", nargs="*", choices=["sampler", "grpo"], default=[])
    p.add_argument("--write-prompts", type=Path, default=None,
                   help="write N GSM8K prompts' ids as JSON (LoCoJAX's venv) and exit")
    p.add_argument("--data-dir", type=Path, default=None)
    args = p.parse_args(argv)
    if args.tiny:
        for name, value in dict(prompts=2, group=4, prompt_len=128, new_tokens=16, steps=2,
                                runs=1).items():
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
    args.grpo_new_tokens = args.grpo_new_tokens or args.new_tokens
    args.rollout_rows = min(args.rollout_rows, args.prompts * args.group)
    if args.rollout_rows % args.group or args.prompts % (args.rollout_rows // args.group):
        p.error("--rollout-rows must be G x a divisor of --prompts")
    if args.prompts % args.train_micro:
        p.error("--train-micro must divide --prompts")
    return args


def model_config(tiny: bool, param_dtype: str, remat: str):
    """tunix's Qwen3 `ModelConfig`: Qwen3-0.6B, or tiny widths at the same vocabulary."""
    import jax.numpy as jnp
    from tunix.models.qwen3 import model as model_lib

    widths = dict(num_layers=28, embed_dim=1024, hidden_dim=3072, num_heads=16, head_dim=128,
                  num_kv_heads=8)
    if tiny:
        widths = dict(num_layers=2, embed_dim=64, hidden_dim=128, num_heads=4, head_dim=16,
                      num_kv_heads=2)
    return model_lib.ModelConfig(
        **widths, vocab_size=151_936, rope_theta=1_000_000, norm_eps=1e-6,
        use_tied_embedding=True, dtype=jnp.bfloat16, param_dtype=getattr(jnp, param_dtype),
        remat_config=getattr(model_lib.RematConfig, remat.upper()))


def model_class(bias: float | None):
    """tunix's Qwen3, or a subclass adding `bias` to the stop ids' logits in one-token calls (the
    sampler's decode steps) only: prefill and training then run tunix's own programs unchanged
    (an add over every position would keep XLA from computing only the prefill's last logits)."""
    import jax.numpy as jnp
    from tunix.models.qwen3 import model as model_lib

    if bias is None:
        return model_lib.Qwen3

    class StopBiasedQwen3(model_lib.Qwen3):
        def __call__(self, *args, **kwargs):
            logits, cache = super().__call__(*args, **kwargs)
            if logits.shape[1] != 1:
                return logits, cache
            vec = jnp.zeros((logits.shape[-1],), logits.dtype).at[jnp.array(STOP_IDS)].set(bias)
            return logits + vec, cache

    return StopBiasedQwen3


def build_model(cls, config, mesh, seed: int):
    """Random weights drawn on the device, each parameter placed by its partition spec."""
    import jax
    from flax import nnx

    def make():
        return cls(config, rngs=nnx.Rngs(params=seed))

    with mesh:
        graphdef, abstract = nnx.split(nnx.eval_shape(make))
        shardings = nnx.get_named_sharding(abstract, mesh)
        state = jax.jit(lambda: nnx.state(make()), out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def rollout_view(model, cls, config):
    """The model's own Variables (shared, so training updates reach it) under a graphdef whose
    config has remat off: tunix's `nnx.remat` inside the sampler's decode `while_loop` raises
    flax's TraceContextError ("Cannot mutate Param from a different trace level", flax 0.12.8)."""
    import dataclasses

    from flax import nnx
    from tunix.models.qwen3 import model as model_lib

    if config.remat_config == model_lib.RematConfig.NONE:
        return model
    plain = dataclasses.replace(config, remat_config=model_lib.RematConfig.NONE)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: cls(plain, rngs=nnx.Rngs(params=0))))
    return nnx.merge(graphdef, nnx.variables(model))


def rollout_engine(view):
    """A `ClusterConfig.rollout_engine` class: tunix's VanillaRollout over `view(actor)`."""
    from tunix.rl.rollout import base_rollout, vanilla_rollout

    class NoRematVanillaRollout(vanilla_rollout.VanillaRollout):
        def __init__(self, rollout_actor, tokenizer, mesh, rollout_config):
            model = view(rollout_actor)
            cfg = model.config
            super().__init__(model, tokenizer, base_rollout.CacheConfig(
                cache_size=rollout_config.kv_cache_size, num_layers=cfg.num_layers,
                num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim))
            self.mesh = mesh

    return NoRematVanillaRollout


class IdTokenizer:
    """Token ids written as space-separated integers (tunix's Sampler takes strings)."""

    def encode(self, text: str, **_) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, **_) -> str:
        return " ".join(str(int(t)) for t in ids)

    def bos_id(self):
        return None

    def eos_id(self) -> int:
        return STOP_IDS[0]

    def pad_id(self) -> int:
        return PAD_ID


def load_prompts(path: Path | None, count: int, width: int, seed: int) -> list[list[int]]:
    """`count` prompts' ids (cycled), each its last `width` tokens; random when no file."""
    if path is not None:
        data = json.loads(Path(path).read_text())
        if isinstance(data, dict):
            data = next(v for k, v in data.items() if k in ("prompt_ids", "prompts", "ids"))
        ids = [[int(t) for t in row][-width:] for row in data]
        log(f"prompts: {len(ids)} from {path}, mean {np.mean([len(r) for r in ids]):.1f} tokens")
    else:
        log("prompts: random ids of GSM8K's chat-prompt lengths (mean 83)")
        rng = np.random.default_rng(seed)
        lengths = np.clip(rng.normal(83, 30, count).astype(int), 20, width)
        ids = [rng.integers(1000, 100_000, k).tolist() for k in lengths]
    return [ids[i % len(ids)] for i in range(count)]


def write_prompts(out: Path, data_dir: Path | None, count: int) -> None:
    """GSM8K train prompts as LoCoJAX renders them (gsm8k_co: template, chat, Qwen3 ids)."""
    from locojax.config.compose import compose_config
    from locojax.data import load_workload, render_prompt
    from locojax.runtime.assemble import tokenizer_for, workload_settings
    from locojax.tokenizers import apply_chat_template

    repo = Path(__file__).resolve().parents[1]
    data_dir = data_dir or next(d for d in (repo.parent / "shared/data/gsm8k",
                                            repo / "shared/data/gsm8k") if d.is_dir())
    cfg = compose_config(["+experiment=gsm8k_co", f"workload.data_dir={data_dir}"])
    w = cfg.workload
    problems = list(load_workload(workload_settings(w), cfg.run.seed).train)[:count]

    def chat(text):
        return apply_chat_template([{"role": "user", "content": text}],
                                   enable_thinking=w.enable_thinking)

    texts = [render_prompt(p, w.prompt_template, chat if w.chat_template else None)
             for p in problems]
    ids = [list(map(int, x)) for x in tokenizer_for(cfg.model, 151_936).batch_encode(texts)]
    out.write_text(json.dumps({"source": f"{data_dir} train, gsm8k_co rendering",
                               "prompt_ids": ids}))
    log(f"wrote {len(ids)} prompts (mean {np.mean([len(r) for r in ids]):.1f} tokens) to {out}")


class PhaseTimer:
    """Wraps a tunix Sampler's jitted prefill and decode programs to time each (blocking)."""

    def __init__(self, sampler):
        self.prefill_s: list[float] = []
        self.decode_s: list[float] = []
        for attr, sink in (("_compiled_prefill_fn", self.prefill_s),
                           ("_compiled_decode_fn", self.decode_s)):
            setattr(sampler, attr, self._timed(getattr(sampler, attr), sink))

    @staticmethod
    def _timed(fn, sink):
        import jax

        def call(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            jax.block_until_ready(out.token_buffer)
            sink.append(time.perf_counter() - start)
            return out

        return call

    def reset(self) -> None:
        self.prefill_s.clear()
        self.decode_s.clear()


def decode_steps(lengths: list[int], cap: int) -> int:
    """Iterations of tunix's decode loop for one call: until every row stopped, or the cap."""
    return cap if max(lengths) >= cap else max(lengths)


def useful_tokens(lengths: list[int], cap: int) -> int:
    """Tokens up to each row's stop (the stop included) or the cap."""
    return sum(min(n + 1, cap) for n in lengths)


def is_oom(err: BaseException) -> bool:
    text = f"{type(err).__name__}: {err}"
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def sampler_pass(sampler, timer, chunks, args, seed0: int) -> dict:
    """One timed pass over every chunk of rows."""
    timer.reset()
    lengths, steps = [], 0
    start = time.perf_counter()
    for i, chunk in enumerate(chunks):
        out = sampler(chunk, max_generation_steps=args.new_tokens,
                      max_prompt_length=args.prompt_len, echo=False, return_logits=False,
                      temperature=1.0, top_p=1.0, top_k=None, eos_tokens=list(STOP_IDS),
                      seed=seed0 + i)
        chunk_lengths = [len(t) for t in out.tokens]
        lengths += chunk_lengths
        steps += decode_steps(chunk_lengths, args.new_tokens)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "lengths": lengths, "steps": steps,
            "prefill_s": sum(timer.prefill_s), "decode_s": sum(timer.decode_s)}


def sampler_runs(model, config, texts: list[str], rows_per_call: int, args) -> dict:
    """Compile with one call, then `args.runs` timed passes; the median pass's figures."""
    from tunix.generate import sampler as sampler_lib

    cache = sampler_lib.CacheConfig(cache_size=args.prompt_len + args.new_tokens,
                                    num_layers=config.num_layers,
                                    num_kv_heads=config.num_kv_heads, head_dim=config.head_dim)
    sampler = sampler_lib.Sampler(model, IdTokenizer(), cache)
    timer = PhaseTimer(sampler)
    chunks = [texts[i:i + rows_per_call] for i in range(0, len(texts), rows_per_call)]
    first = sampler_pass(sampler, timer, chunks[:1], args, seed0=10_000)
    passes = [sampler_pass(sampler, timer, chunks, args, seed0=1 + r * len(chunks))
              for r in range(args.runs)]
    best = sorted(passes, key=lambda p: p["seconds"])[(len(passes) - 1) // 2]
    lengths, cap = best["lengths"], args.new_tokens
    useful = useful_tokens(lengths, cap)
    return {
        "rows": len(texts), "rows_per_call": rows_per_call, "calls": len(chunks),
        "prompt_len": args.prompt_len, "new_tokens": cap, "cache_size": cache.cache_size,
        "useful_tok_s": round(useful / best["seconds"], 1), "seconds": round(best["seconds"], 3),
        "useful_tokens": useful, "mean_length": round(float(np.mean(lengths)), 1),
        "at_cap": round(float(np.mean(np.asarray(lengths) >= cap)), 4),
        "compile_s": round(first["seconds"] - best["seconds"] / len(chunks), 2),
        "prefill_s": round(best["prefill_s"], 4), "decode_s": round(best["decode_s"], 3),
        "decode_steps": best["steps"],
        "ms_per_decode_step": round(1000 * best["decode_s"] / max(1, best["steps"]), 3),
        "slot_tok_s": round(rows_per_call * best["steps"] / best["seconds"], 1),
        "host_s": round(best["seconds"] - best["prefill_s"] - best["decode_s"], 4),
        "pass_seconds": [round(p["seconds"], 3) for p in passes],
    }


def bench_sampler(model, config, prompts: list[list[int]], args, mesh) -> dict:
    """(a): tunix's Sampler on N x G rows; rows per call halved on an out-of-memory error."""
    texts = [" ".join(map(str, ids)) for ids in prompts for _ in range(args.group)]
    rows = args.rollout_rows
    while True:
        try:
            with mesh:
                return sampler_runs(model, config, texts, rows, args)
        except Exception as err:  # noqa: BLE001 - an OOM retries smaller, the rest is reported
            if not is_oom(err) or rows <= args.group or args.prompts % (rows // 2 // args.group):
                raise
            log(f"sampler: {rows} rows a call ran out of memory; trying {rows // 2}")
            rows //= 2
            gc.collect()


class StepClock:
    """Per GRPO step: its seconds (from the previous step's end, or the train call, to its last
    update's end) and the rollout, reward and train seconds inside it."""

    def __init__(self, updates_per_step: int):
        self.updates_per_step = updates_per_step
        self.updates = 0
        self.t0 = time.perf_counter()
        self.steps: list[dict] = []
        self.open = False

    def phase(self, name: str, seconds: float) -> None:
        step = self.steps[-1]
        step[name] = step.get(name, 0.0) + seconds

    def rollout_started(self) -> None:
        if not self.open:
            self.steps.append({})
            self.open = True

    def update_done(self, block) -> None:
        self.updates += 1
        if self.updates % self.updates_per_step == 0:
            block()
            self.steps[-1]["end"] = time.perf_counter()
            self.open = False

    def summary(self) -> list[dict]:
        out, last = [], self.t0
        for s in self.steps:
            total = s.get("end", last) - last
            last = s.get("end", last)
            parts = {k: round(s.get(k, 0.0), 3) for k in ("rollout_s", "reward_s", "train_s")}
            other = total - sum(parts.values())
            out.append({"step_s": round(total, 3), **parts, "other_s": round(other, 3),
                        "useful_tokens": int(s.get("useful_tokens", 0)),
                        "length_sum": int(s.get("length_sum", 0)),
                        "prefill_s": round(s.get("prefill_s", 0.0), 3),
                        "decode_s": round(s.get("decode_s", 0.0), 3)})
        return out


def grpo_cluster(model, args, mesh, engine):
    """tunix's RLCluster (colocated, vanilla rollout) and GRPOLearner with a random reward."""
    import optax
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    n, new = args.prompts, args.grpo_new_tokens
    rollout_micro = args.rollout_rows // args.group
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=new, max_prompt_length=args.prompt_len,
        kv_cache_size=args.prompt_len + new, temperature=1.0, top_p=1.0, top_k=None,
        seed=args.seed, eos_tokens=list(STOP_IDS))  # an int: a key Array is donated, then gone
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optax.chain(optax.clip_by_global_norm(1.0),
                                    optax.adamw(args.lr, b1=0.9, b2=0.999, weight_decay=0.0)),
        eval_every_n_steps=10**9, max_steps=args.steps, mini_batch_size=n,
        train_micro_batch_size=args.train_micro, rollout_micro_batch_size=rollout_micro,
        compute_logps_micro_batch_size=rollout_micro, pbar_description=None)
    roles = (rl_cluster_lib.Role.ACTOR, rl_cluster_lib.Role.REFERENCE, rl_cluster_lib.Role.ROLLOUT)
    cluster = rl_cluster_lib.RLCluster(
        actor=model, tokenizer=IdTokenizer(),
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={role: mesh for role in roles}, rollout_engine=engine,
            offload_to_cpu=False, training_config=training, rollout_config=rollout))
    rng = np.random.default_rng(args.seed)

    def random_reward(prompts, completions, **_):
        return rng.random(len(completions)).tolist()

    algo = grpo_learner.GRPOConfig(num_generations=args.group, num_iterations=1, beta=0.0,
                                   epsilon=0.2, loss_agg_mode="token-mean")
    learner = grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo,
                                       reward_fns=[random_reward])
    return cluster, learner


def instrument_grpo(cluster, learner, clock: StepClock, cap: int) -> None:
    """Times RLCluster.generate, the reward manager and RLCluster.update_actor per step."""
    import jax
    from flax import nnx

    generate, update, reward = cluster.generate, cluster.update_actor, learner.reward_manager
    timer = PhaseTimer(cluster.rollout._sampler)  # noqa: SLF001 - its two jitted programs

    def timed_generate(*a, **k):
        clock.rollout_started()
        timer.reset()
        start = time.perf_counter()
        out = generate(*a, **k)
        clock.phase("rollout_s", time.perf_counter() - start)
        clock.phase("prefill_s", sum(timer.prefill_s))
        clock.phase("decode_s", sum(timer.decode_s))
        lengths = [len(t) for t in out.tokens]
        clock.phase("useful_tokens", useful_tokens(lengths, cap))
        clock.phase("length_sum", sum(lengths))
        return out

    def timed_reward(*a, **k):
        start = time.perf_counter()
        out = reward(*a, **k)
        clock.phase("reward_s", time.perf_counter() - start)
        return out

    def timed_update(*a, **k):
        start = time.perf_counter()
        out = update(*a, **k)
        clock.update_done(lambda: jax.block_until_ready(nnx.state(cluster.actor_trainer.model)))
        clock.phase("train_s", time.perf_counter() - start)
        return out

    cluster.generate, cluster.update_actor = timed_generate, timed_update
    learner.reward_manager = timed_reward


def bench_grpo(model, prompts: list[list[int]], args, mesh, engine) -> dict:
    """(b): `args.steps` whole GRPO steps of N prompts x G through tunix's GRPOLearner."""
    import jax
    from flax import nnx

    n = args.prompts
    texts = [" ".join(map(str, ids)) for ids in prompts]
    batches = [{"prompts": np.array(texts[k * n:(k + 1) * n])} for k in range(args.steps)]
    start = time.perf_counter()
    cluster, learner = grpo_cluster(model, args, mesh, engine)
    setup_s = time.perf_counter() - start
    clock = StepClock(updates_per_step=n // args.train_micro)
    instrument_grpo(cluster, learner, clock, args.grpo_new_tokens)
    start = clock.t0 = time.perf_counter()
    learner.train(batches)
    jax.block_until_ready(nnx.state(cluster.actor_trainer.model))
    total_s = time.perf_counter() - start
    steps = clock.summary()
    later = steps[1:] or steps
    mean = {k: round(statistics.mean(s[k] for s in later), 3)
            for k in ("step_s", "rollout_s", "reward_s", "train_s", "other_s", "prefill_s",
                      "decode_s")}
    tokens = statistics.mean(s["useful_tokens"] for s in later)
    length_sum = statistics.mean(s["length_sum"] for s in later)
    rows = n * args.group
    return {
        "prompts": n, "group": args.group, "rows": rows, "prompt_len": args.prompt_len,
        "new_tokens": args.grpo_new_tokens, "train_micro_rows": args.train_micro * args.group,
        "rollout_micro_rows": args.rollout_rows, "remat": args.remat,
        "param_dtype": args.param_dtype, "reward": "uniform random [0, 1), seeded",
        "steps_timed": len(later), "mean_after_first": mean,
        "first_step_s": steps[0]["step_s"] if steps else None,
        "rollout_useful_tok_s": round(tokens / mean["rollout_s"], 1) if mean["rollout_s"] else None,
        "mean_length": round(length_sum / rows, 1), "setup_s": round(setup_s, 2),
        "train_call_s": round(total_s, 2), "steps": steps,
    }


def memory() -> dict:
    """The device's own counters (TPU and GPU report them; the CPU does not)."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    keys = ("peak_bytes_in_use", "bytes_in_use", "bytes_limit")
    return {k: round(stats[k] / 2**30, 3) for k in keys if k in stats} or {"note": "none"}


def versions() -> dict:
    from importlib import metadata

    out = {}
    for name in ("google-tunix", "jax", "jaxlib", "flax", "optax", "libtpu"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def stop_bias(text: str, new_tokens: int) -> float | None:
    if text == "none":
        return None
    if text == "auto":
        return round(math.log(151_936 / max(1.0, new_tokens / 3)), 3)
    return float(text)


def run_part(name: str, fn) -> dict:
    start = time.perf_counter()
    try:
        out = fn()
    except Exception as err:  # noqa: BLE001 - reported in the JSON, the other part still runs
        import traceback

        traceback.print_exc()
        out = {"error": f"{type(err).__name__}: {str(err)[:800]}"}
    out["wall_s"] = round(time.perf_counter() - start, 2)
    log(f"{name}: {json.dumps(out)}")
    gc.collect()
    return out


def main() -> None:
    args = parse_args()
    if args.write_prompts:
        write_prompts(args.write_prompts, args.data_dir, max(384, args.prompts * args.steps))
        return
    import jax

    if args.tiny:
        jax.config.update("jax_platforms", "cpu")
    # A fresh persistent compilation cache: (b)'s rollout runs the very programs (a) compiled
    # (same shapes), so it loads them instead of compiling them again; nothing older is reused.
    cache_dir = tempfile.mkdtemp(prefix="tunix_chip_xla_")
    atexit.register(shutil.rmtree, cache_dir, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    bias = stop_bias(args.stop_bias, args.new_tokens)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    config = model_config(args.tiny, args.param_dtype, args.remat)
    prompts = load_prompts(args.prompts_file, args.prompts * (1 + args.steps), args.prompt_len,
                           args.seed)
    summary = {"device": str(jax.devices()[0].device_kind), "settings": {
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "stop_bias_value": bias, "stop_ids": list(STOP_IDS), "pad_id": PAD_ID,
        "compilation_cache": cache_dir,
        "layers": config.num_layers, "hidden": config.embed_dim}}
    log(f"settings: {summary['settings']}")
    start = time.perf_counter()
    cls = model_class(bias)
    model = build_model(cls, config, mesh, args.seed)
    summary["model_init_s"] = round(time.perf_counter() - start, 2)

    def view(actor):
        return rollout_view(actor, cls, config)

    if "sampler" not in args.skip:
        summary["sampler"] = run_part("sampler", lambda: bench_sampler(
            view(model), config, prompts[:args.prompts], args, mesh))
        # Fewer rows a call after an out-of-memory error: (b)'s rollout takes as many.
        args.rollout_rows = summary["sampler"].get("rows_per_call", args.rollout_rows)
    summary["memory"] = {"after_sampler": memory()}
    engine = "vanilla" if args.remat == "none" else rollout_engine(view)
    if "grpo" not in args.skip:
        summary["grpo"] = run_part("grpo", lambda: bench_grpo(
            model, prompts[args.prompts:], args, mesh, engine))
    summary["memory"]["after_grpo"] = memory()
    summary["versions"] = versions()
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()

"""Whole GRPO steps: LoCoJAX (CO, one host) next to tunix's GRPOLearner and TRL's GRPOTrainer.

One recipe, three frameworks, each in its own process from the same HF checkpoint directory
(config.json, model.safetensors and tokenizer files all three read), on the same prompts in
the same order, one after another:

| setting | LoCoJAX | tunix GRPOLearner | TRL GRPOTrainer |
|---|---|---|---|
| weights | model.checkpoint=DIR | create_model_from_safe_tensors(DIR) | from_pretrained(DIR) |
| prompts / step, G | workload.prompts_per_step, group_size | batch of P, num_generations | per_device_train_batch_size=P*G, num_generations |
| data order | its stream for run.seed | that list, one batch per step | that list, shuffle_dataset=False |
| lengths | max_prompt_len, max_response_len | max_prompt_length, max_tokens_to_generate | max_completion_length (prompts fit) |
| sampling | T=1, top_p 1, top_k 0 | T=1, top_p 1.0, top_k None | T=1, top_p 1.0, top_k 0 |
| lr | constant, no warm-up | optax adamw, constant | lr_scheduler_type=constant, warmup 0 |
| clip, grad clip | clip_eps 0.2/0.2, 1.0 | epsilon 0.2, epsilon_high 0.2, clip_by_global_norm | epsilon 0.2, epsilon_high 0.2, max_grad_norm |
| updates / batch | optimizer_steps_per_batch=1 | num_iterations=1, mini-batch = batch | num_iterations=1, accumulation 1 |
| KL | kl_coef=0 | beta=0 | beta=0 |
| aggregation | token_mean | loss_agg_mode=token-mean | loss_type=dapo (token mean over the batch) |
| advantage | (r - mean) / (std_pop + 1e-6) | (r - mean) / (std_sample + 1e-6) | scale_rewards=group: / (std_sample + 1e-4) |
| reward | its scorer | LoCoJAX's scorer | LoCoJAX's scorer |
| precision | fp32 | fp32 | fp32 (bf16=False), gradient_checkpointing=False |

No peer offers the population std of a group (ddof 0): both divide by the sample std, a
factor sqrt(G/(G-1)) on the advantages (1.15 at G=4, 1.03 at G=16), which Adam's scale
invariance mostly absorbs. Threads: every process sees the same cores; torch gets
set_num_threads(cores), XLA (LoCoJAX, tunix) uses all cores by default.

Cases:
- speed: the rollout benchmark's tiny Qwen3 (hidden 256, 4 layers, vocab 151,936, fp32,
  random weights from LoCoJAX's initialisation) on GSM8K train prompts (Qwen3 chat template,
  the ones that fit 128 tokens), 8 prompts x 4 samples, 32 new tokens; median seconds per step
  after `--warmup` steps (compilation and first-call costs), and the split into rollout,
  scoring and the rest (training).
- learning: LoCoJAX's `arith_co` model after its supervised warm-up (a LoCoJAX run with
  run.steps=0 exports it as hf/), then `--learning-steps` GRPO steps per seed at arith_co's
  recipe (24 prompts x 16, lr 5e-4): mean reward per step, the mean of the last 10, one PNG.
  LoCoJAX's arms (`ARMS`, `--arms`) run the same again with one setting changed:
  `dynamic_sampling` (algorithm.dynamic_sampling=filter: its step's prompts first, further
  batches of other prompts while groups lack signal; its reward is over all it sampled),
  `lora16` and `lora64` (algorithm.lora.rank=16 / 64, all seven block matmuls, alpha 32,
  trained on the same warmed base, at `LORA_LR`: see `ARMS`), `updates2`
  (algorithm.optimizer_steps_per_batch=2, the gsm8k_*/numina_* recipes' setting) and `gspo`
  (algorithm.ratio_level=sequence at the GSPO paper's clip range, 2 updates per batch).

    python benchmarks/grpo.py [--cases speed learning] [--peers tunix trl] [--seeds 0 1 2]

Peers run in the peers' venv (`make peers`, or LOCOJAX_PEERS_PYTHON); a missing or failing
peer is reported on stderr and as null. The last stdout line is JSON: {"speed": {...},
"learning": {...}, "versions": {...}}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a CPU benchmark: never loads libtpu

import numpy as np  # noqa: E402
from child_env import child_env  # noqa: E402
from grpo_recipe import Prompt, Recipe
from peers_python import peer_python

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = Path(os.environ.get("LOCOJAX_DATA_DIR", REPO.parent / "shared" / "data"))
PEERS = {"tunix": HERE / "grpo_tunix.py", "trl": HERE / "grpo_trl.py"}
FINAL_WINDOW = 10
SPEED_ARCH = dict(num_layers=4, hidden=256, num_heads=4, num_kv_heads=2, head_dim=64, ffn=768,
                  vocab=151_936)
SPEED = dict(prompts=8, group=4, prompt_len=128, new_tokens=32, lr=1e-6, arch=SPEED_ARCH)
LEARN = dict(prompts=24, group=16, prompt_len=16, new_tokens=12, lr=5e-4, sft_steps=20)
LEARN_OVERRIDES = ["+experiment=arith_co"]
LORA_LR = 1.5e-3
"""The LoRA arms' rate at rank 16 (alpha 32): 3x the recipe's, so the first Adam steps move
W per element about as much as full fine-tuning's (docs/lora.md, "Measured")."""
ARMS = {
    "dynamic_sampling": ["algorithm.dynamic_sampling=filter"],
    # LoRA on the same warmed base (arith_co's algorithm.lora.warmup=full, or the warm
    # checkpoint), alpha 32, one rate for both ranks: twice it collapsed the entropy at
    # either rank on arith_co (docs/lora.md, "Measured").
    "lora16": ["algorithm.lora.rank=16", f"algorithm.lora.learning_rate={LORA_LR}"],
    "lora64": ["algorithm.lora.rank=64", f"algorithm.lora.learning_rate={LORA_LR}"],
    # The gsm8k_* / numina_* recipes' 2 optimizer steps per batch (mini-batches of half the
    # rows), token ratio: the clip binds on the second update.
    "updates2": ["algorithm.optimizer_steps_per_batch=2"],
    # GSPO (Zheng et al. 2025, arXiv:2507.18071): the sequence ratio at the paper's clip range
    # (section 5.1: 3e-4 / 4e-4), at 2 updates per batch (compare with `updates2`). At one
    # update the ratio is 1 and its gspo-token gradient is GRPO's token-mean one exactly
    # (measured: bit-identical losses and rewards), so GSPO needs several updates to differ.
    "gspo": ["algorithm.optimizer_steps_per_batch=2", "algorithm.ratio_level=sequence",
             "algorithm.clip_eps=3e-4", "algorithm.clip_eps_high=4e-4"],
    # Rollout correction on a real mismatch: top-p 0.9 sampling, whose engine draws from the
    # renormalised nucleus while the trainer scores the full softmax (w = the kept mass).
    # Plain GRPO (no correction) beside TIS (the default) and MIS (tokens outside [0.5, 2]
    # masked).
    "topp_plain": ["sampling.top_p=0.9", "algorithm.rollout_correction=none"],
    "topp_tis": ["sampling.top_p=0.9", "algorithm.rollout_correction=tis"],
    "topp_mis": ["sampling.top_p=0.9", "algorithm.rollout_correction=mis"],
}
"""LoCoJAX's further arms of the learning case: the same prompts, seeds and start, the
settings named changed (`locojax_<arm>` in the table and the JSON); they come last on the
command line, so they win over the recipe's (its learning rate)."""
# `--smoke` (the CI test): the same pipeline at a few rows, figures meaningless.
SMOKE_SPEED = SPEED | dict(prompts=2, group=2, new_tokens=4,
                           arch=SPEED_ARCH | dict(num_layers=1, hidden=64, head_dim=16, ffn=128))
"""The speed case's pipeline on a 1-layer, 64-wide model (the Qwen vocabulary kept: the peers
read the checkpoint's tokenizer)."""
SMOKE_LEARN = LEARN | dict(prompts=4, group=4, sft_steps=2)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _env() -> dict:
    return child_env(JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false", HYDRA_FULL_ERROR="1")


def _run(cmd: list[str], log_path: Path, what: str) -> None:
    with log_path.open("w") as err:
        code = subprocess.run(cmd, env=_env(), stdout=err, stderr=subprocess.STDOUT,
                              cwd=REPO).returncode
    if code:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"{what} exited {code}; end of {log_path}:\n{tail}")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- the workloads: checkpoint directory and per-step prompts ----


def _recipe(case, ckpt, steps, sizes, seed, stop_ids) -> Recipe:
    return Recipe(
        case=case, checkpoint=str(ckpt), steps=steps, group_size=sizes["group"],
        max_prompt_len=sizes["prompt_len"], max_new_tokens=sizes["new_tokens"],
        temperature=1.0, learning_rate=sizes["lr"], adam_b1=0.9, adam_b2=0.999, adam_eps=1e-8,
        weight_decay=0.0, grad_clip=1.0, clip_eps=0.2, clip_eps_high=0.2, format_reward=0.1,
        seed=seed, threads=os.cpu_count() or 1, stop_ids=list(stop_ids),
    )


def _prompts_per_step(settings, tokenizer, template, chat, seed, steps, per_step):
    """The prompts LoCoJAX's stream gives each step for `seed`, rendered and encoded."""
    from locojax.data import PromptStream, load_workload, render_prompt
    from locojax.data.stream import DataPosition
    from locojax.tokenizers import apply_chat_template

    def user_turn(text):
        return apply_chat_template([{"role": "user", "content": text}])

    workload = load_workload(settings, seed)
    stream = PromptStream(len(workload.train), per_step, DataPosition(seed))
    out = []
    for step in range(steps):
        problems = [workload.train[int(i)] for i in stream.batch(step)]
        texts = [render_prompt(p, template, user_turn if chat else None) for p in problems]
        ids = tokenizer.batch_encode(texts)
        out.append([Prompt(t, i, p.answer) for t, i, p in zip(texts, ids, problems, strict=True)])
    return out


GSM8K_TEMPLATE = "{question}\nLet's think step by step and output the final answer after \"####\"."


def _size_overrides(sizes: dict) -> list[str]:
    return [f"workload.max_prompt_len={sizes['prompt_len']}",
            f"workload.max_response_len={sizes['new_tokens']}",
            f"workload.prompts_per_step={sizes['prompts']}",
            f"workload.group_size={sizes['group']}"]


def speed_workload(work: Path, steps: int, seed: int, start: str,
                   sizes: dict) -> tuple[Recipe, list[str]]:
    """Random-init tiny Qwen3 + Qwen3 tokenizer; GSM8K train rows whose prompt fits 128 tokens.

    The weights are LoCoJAX's initialisation for `seed`, so LoCoJAX either loads them
    (`start=checkpoint`) or makes them again (`replay`).
    """
    from flax import nnx

    from locojax.data import WorkloadSettings
    from locojax.model import ModelArch, Qwen3, export_hf_checkpoint, split_params
    from locojax.tokenizers import apply_chat_template, load_tokenizer, save_checkpoint_tokenizer

    tok = load_tokenizer("qwen")
    ckpt = work / "ckpt"
    arch = ModelArch(**sizes["arch"], tie_embeddings=True, dtype="float32")
    _, params = split_params(Qwen3(arch, rngs=nnx.Rngs(seed)))  # LoCoJAX's own initialisation
    export_hf_checkpoint(arch, params, ckpt)
    save_checkpoint_tokenizer(tok, ckpt)
    data = work / "gsm8k"
    data.mkdir()
    for split in ("train", "test"):
        rows = [json.loads(x) for x in (DATA / "gsm8k" / f"{split}.jsonl").read_text().splitlines()]
        texts = [apply_chat_template([{"role": "user", "content": GSM8K_TEMPLATE.format(
            question=r["question"])}]) for r in rows]
        fits = [r for r, ids in zip(rows, tok.batch_encode(texts), strict=True)
                if len(ids) <= sizes["prompt_len"]]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fits))
    settings = WorkloadSettings(name="gsm8k", data_dir=str(data), prompt_template=GSM8K_TEMPLATE)
    steps_prompts = _prompts_per_step(settings, tok, GSM8K_TEMPLATE, True, seed, steps,
                                      sizes["prompts"])
    overrides = ["+experiment=gsm8k_co", "model=tiny", f"workload.data_dir={data}",
                 *_size_overrides(sizes), *(f"model.{k}={v}" for k, v in sizes["arch"].items())]
    overrides += [f"model.checkpoint={ckpt}"] if start == "checkpoint" else []
    return _recipe("speed", ckpt, steps_prompts, sizes, seed, tok.stop_ids), overrides


def warm_checkpoint(work: Path, seed: int, sizes: dict) -> Path:
    """LoCoJAX's `arith_co` supervised warm-up alone (run.steps=0): its hf/ export + tokenizer."""
    from locojax.tokenizers import load_tokenizer, save_checkpoint_tokenizer

    run_dir = work / "warmup"
    _run([sys.executable, "-m", "locojax", *LEARN_OVERRIDES, *_size_overrides(sizes),
          "run.steps=0", f"run.seed={seed}",
          f"algorithm.sft_warmup_steps={sizes['sft_steps']}", "run.eval_every=0",
          "run.checkpoint_every=0", f"hydra.run.dir={run_dir}"], work / "warmup.log",
         "LoCoJAX warm-up")
    ckpt = work / "ckpt"
    shutil.copytree(run_dir / "hf", ckpt)
    save_checkpoint_tokenizer(load_tokenizer("char"), ckpt)
    return ckpt


def sft_line(log_path: Path) -> str:
    """LoCoJAX's `supervised warm-up: N steps, loss a -> b` line of a run's log."""
    lines = [x for x in log_path.read_text().splitlines() if x.startswith("supervised warm-up")]
    if not lines:
        raise RuntimeError(f"no supervised warm-up line in {log_path}")
    return lines[0]


def learning_workload(ckpt: Path, steps: int, seed: int, start: str,
                      sizes: dict) -> tuple[Recipe, list[str]]:
    """arith_co's prompts for `seed`; LoCoJAX starts from `ckpt` or replays its warm-up."""
    from locojax.data import WorkloadSettings
    from locojax.tokenizers import load_tokenizer

    tok = load_tokenizer("char")
    steps_prompts = _prompts_per_step(WorkloadSettings(name="arith"), tok, "{question}", False,
                                      seed, steps, sizes["prompts"])
    overrides = [*LEARN_OVERRIDES, *_size_overrides(sizes)]
    if start == "checkpoint":
        overrides += [f"model.checkpoint={ckpt}", "algorithm.sft_warmup_steps=0"]
    else:  # the same seed's warm-up again: the weights `ckpt` holds (checked by its loss line)
        overrides += [f"algorithm.sft_warmup_steps={sizes['sft_steps']}"]
    return _recipe("learning", ckpt, steps_prompts, sizes, seed, tok.stop_ids), overrides


# ---- the frameworks: each returns one row per step ----


def run_locojax(recipe: Recipe, overrides: list[str], work: Path,
                arm: list[str] = ()) -> list[dict]:
    """LoCoJAX on `recipe`, with `arm`'s overrides last (they win)."""
    run_dir = work / "locojax"
    _run([sys.executable, "-m", "locojax", *overrides, f"run.steps={len(recipe.steps)}",
          f"run.seed={recipe.seed}", "algorithm.lr_schedule=constant", "algorithm.warmup_steps=0",
          f"algorithm.learning_rate={recipe.learning_rate}", "run.eval_every=0",
          # the peers' recipe, not the experiment's field defaults (4 updates, clip-high 0.28,
          # no format bonus): one update per batch, the recipe's clips and format reward
          "algorithm.optimizer_steps_per_batch=1", f"algorithm.clip_eps={recipe.clip_eps}",
          f"algorithm.clip_eps_high={recipe.clip_eps_high}",
          f"workload.format_reward={recipe.format_reward}",
          "run.checkpoint_every=0", f"hydra.run.dir={run_dir}", *arm], work / "locojax.log",
         "LoCoJAX")
    rows = _rows(run_dir / "metrics.jsonl")
    keep = ("step", "reward_mean", "step_s", "rollout_s", "reward_s")
    measured = ("logp_mismatch_mean", "rc_weight_mean", "rc_clip_frac", "rc_mask_frac")
    return [{k: r[k] for k in keep} | {"train_s": r["step_s"] - r["rollout_s"] - r["reward_s"]}
            | {k: r[k] for k in measured if k in r} for r in rows]


def run_peer(name: str, recipe: Recipe, work: Path) -> list[dict] | None:
    python = peer_python(name)
    if not python.exists():
        log(f"{name}: skipped, {python} not found (`make peers`, or LOCOJAX_PEERS_PYTHON)")
        return None
    spec, out = work / f"{name}-recipe.json", work / f"{name}.jsonl"
    recipe.to_json(spec)
    try:
        _run([str(python), str(PEERS[name]), str(spec), str(out)], work / f"{name}.log", name)
    except RuntimeError as err:
        log(f"{name}: failed, reported as null: {err}")
        return None
    rows = _rows(out)
    if len(rows) != len(recipe.steps):
        log(f"{name}: {len(rows)} step rows for {len(recipe.steps)} steps, reported as null")
        return None
    return rows


def run_all(recipe, overrides, work, peers) -> dict[str, list[dict] | None]:
    out = {"locojax": run_locojax(recipe, overrides, work)}
    for name in peers:
        out[name] = run_peer(name, recipe, work)
    return out


# ---- the cases ----


def _median(rows: list[dict], key: str, warmup: int) -> float:
    return statistics.median(r[key] for r in rows[warmup:])


def speed_case(work: Path, steps: int, warmup: int, peers: list[str], start: str,
               sizes: dict) -> dict:
    work.mkdir(parents=True)
    recipe, overrides = speed_workload(work, steps, 0, start, sizes)
    runs = run_all(recipe, overrides, work, peers)
    table = {}
    for name, rows in runs.items():
        if rows is not None:
            table[name] = {k: round(_median(rows, k, warmup), 3)
                           for k in ("step_s", "rollout_s", "reward_s", "train_s")}
            table[name]["first_step_s"] = round(rows[0]["step_s"], 2)
    print(f"\nSpeed: median s/step over steps {warmup}..{steps - 1} ({sizes['prompts']} prompts "
          f"x {sizes['group']}, {sizes['prompt_len']} + {sizes['new_tokens']} tokens, vocab "
          f"151,936, fp32, {os.cpu_count()} cores)")
    print("| framework | step | rollout | scoring | training | first step | vs LoCoJAX |")
    print("|---|---|---|---|---|---|---|")
    ours = table["locojax"]["step_s"]
    for name, t in table.items():
        print(f"| {name} | {t['step_s']:.2f} | {t['rollout_s']:.2f} | {t['reward_s']:.3f} | "
              f"{t['train_s']:.2f} | {t['first_step_s']:.1f} | {t['step_s'] / ours:.2f}x |")
    step = {name: (table[name]["step_s"] if name in table else None) for name in ("tunix", "trl")}
    return {
        "locojax_step_s": ours, "tunix_step_s": step["tunix"], "trl_step_s": step["trl"],
        "vs_tunix": round(step["tunix"] / ours, 2) if step["tunix"] else None,
        "vs_trl": round(step["trl"] / ours, 2) if step["trl"] else None,
        "details": table,
    }


def learning_case(work: Path, steps: int, seeds: list[int], peers: list[str],
                  start: str, sizes: dict, arms: list[str] = ()) -> dict:
    """Per seed, the three frameworks from one warm checkpoint (shared by all seeds when
    LoCoJAX loads HF checkpoints, `start=checkpoint`; else each seed's own warm-up, which
    LoCoJAX replays bit for bit, `start=replay`)."""
    work.mkdir(parents=True)
    shared = warm_checkpoint(work, seeds[0], sizes) if start == "checkpoint" else None
    names = ["locojax", *(f"locojax_{a}" for a in arms), *peers]
    curves: dict[str, list[list[float]] | None] = {name: [] for name in names}
    measured: dict[str, list[dict]] = {name: [] for name in names}
    for seed in seeds:
        seed_dir = work / f"seed{seed}"
        seed_dir.mkdir()
        ckpt = shared or warm_checkpoint(seed_dir, seed, sizes)
        recipe, overrides = learning_workload(ckpt, steps, seed, start, sizes)
        runs = run_all(recipe, overrides, seed_dir, peers)
        for arm in arms:
            (seed_dir / arm).mkdir()
            runs[f"locojax_{arm}"] = run_locojax(recipe, overrides, seed_dir / arm, ARMS[arm])
        if start == "replay" and sft_line(seed_dir / "locojax.log") != sft_line(
                seed_dir / "warmup.log"):
            raise RuntimeError(f"seed {seed}: LoCoJAX's warm-up replay differs from the "
                               "checkpoint's; the peers would start elsewhere")
        for name, rows in runs.items():
            if rows is None or curves[name] is None:
                curves[name] = None
            else:
                curves[name].append([r["reward_mean"] for r in rows])
                measured[name] += rows
    finals = {}
    print(f"\nLearning: arith from LoCoJAX's supervised warm-up ({sizes['sft_steps']} steps), "
          f"{steps} GRPO steps of {sizes['prompts']} x {sizes['group']}, seeds {seeds}")
    print("| framework | first step | final 10-step mean per seed | mean | std over seeds |")
    print("|---|---|---|---|---|")
    for name, c in curves.items():
        if not c:
            finals[name] = None
            continue
        per_seed = [float(np.mean(x[-FINAL_WINDOW:])) for x in c]
        finals[name] = round(float(np.mean(per_seed)), 3)
        first = float(np.mean([x[0] for x in c]))
        print(f"| {name} | {first:.3f} | {', '.join(f'{v:.3f}' for v in per_seed)} | "
              f"{finals[name]:.3f} | {np.std(per_seed):.3f} |")
    correction = correction_table(measured)
    png = plot_curves(curves, work / "grpo_learning.png", steps)
    print(f"curves: {png}")
    return {f"{k}_final": finals.get(k) for k in ("locojax", "tunix", "trl", *names)} | {
        "curves": {k: v for k, v in curves.items() if v}, "plot": str(png), "start": start,
        "correction": correction}


def correction_table(measured: dict[str, list[dict]]) -> dict[str, dict]:
    """Per LoCoJAX run, the means over its steps of what the rollout correction measured
    (the keys a run without it lacks are left out); printed as a table."""
    keys = ("logp_mismatch_mean", "rc_weight_mean", "rc_clip_frac", "rc_mask_frac")
    table = {name: {k: round(float(np.mean([r[k] for r in rows])), 5) for k in keys
                    if rows and all(k in r for r in rows)}
             for name, rows in measured.items() if name.startswith("locojax")}
    print("\nRollout correction (means over steps and seeds; absent: not measured)")
    print("| run | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, got in table.items():
        print(f"| {name} | " + " | ".join(str(got.get(k, "-")) for k in keys) + " |")
    return table


def plot_curves(curves: dict, path: Path, steps: int) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, c in curves.items():
        if not c:
            continue
        arr = np.asarray(c)
        mean = arr.mean(axis=0)
        line, = ax.plot(np.arange(arr.shape[1]), mean, label=f"{name} (mean of {len(c)} seeds)")
        ax.fill_between(np.arange(arr.shape[1]), arr.min(axis=0), arr.max(axis=0),
                        color=line.get_color(), alpha=0.15)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward")
    ax.set_title(f"arith from LoCoJAX's supervised warm-up: {steps} GRPO steps")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def versions(peers: list[str]) -> dict:
    import jax

    out = {"jax": jax.__version__}
    python = peer_python("trl")
    if peers and python.exists():
        code = ("import json, importlib.metadata as m; print(json.dumps({p: m.version(p) for p in "
                "['torch', 'transformers', 'google-tunix', 'trl', 'jax']}))")
        got = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
        if got.returncode == 0:
            peer = json.loads(got.stdout)
            out |= {"peers_jax": peer.pop("jax"), **peer}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=["speed", "learning"],
                        default=["speed", "learning"])
    parser.add_argument("--peers", nargs="*", choices=sorted(PEERS), default=sorted(PEERS),
                        help="peers next to LoCoJAX (none: `--peers`)")
    parser.add_argument("--speed-steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="speed steps left out of the median")
    parser.add_argument("--learning-steps", type=int, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="*", choices=sorted(ARMS), default=sorted(ARMS),
                        help="LoCoJAX's further learning arms (none: `--arms`)")
    parser.add_argument("--out", type=Path, default=None, help="keep the work here (PNG, logs)")
    parser.add_argument("--locojax-start", choices=["checkpoint", "replay"], default="replay",
                        help="LoCoJAX loads the peers' checkpoint, or makes the same weights again "
                        "(its initialisation; the learning case's warm-up, per seed)")
    parser.add_argument("--smoke", action="store_true",
                        help="a few rows per step and 2 warm-up steps: the pipeline only (CI)")
    args = parser.parse_args()
    log(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    work = args.out or Path(tempfile.mkdtemp(prefix="grpo-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    report: dict = {}
    if "speed" in args.cases:
        report["speed"] = speed_case(work / "speed", args.speed_steps, args.warmup, args.peers,
                                     args.locojax_start, SMOKE_SPEED if args.smoke else SPEED)
    if "learning" in args.cases:
        report["learning"] = learning_case(work / "learning", args.learning_steps, args.seeds,
                                           args.peers, args.locojax_start,
                                           SMOKE_LEARN if args.smoke else LEARN, args.arms)
    report["versions"] = versions(args.peers)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

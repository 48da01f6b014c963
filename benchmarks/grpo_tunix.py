"""tunix's `GRPOLearner` on a benchmarks/grpo.py recipe (run in the peers' venv).

    PY benchmarks/grpo_tunix.py RECIPE.json OUT.jsonl

What is set, against LoCoJAX's recipe (see benchmarks/grpo.py for the whole table):
- model: tunix's own Qwen3 (`tunix.models.qwen3`), weights read from the checkpoint's
  safetensors with its own mapping; fp32; one (fsdp=1, tp=1) mesh that the actor, rollout
  and (unused) reference share, so the rollout reads the trained weights with no copy.
- rollout: the vanilla engine (tunix's `Sampler`), temperature 1, top_p 1.0, top_k None (the
  full vocabulary), KV cache exactly prompt + new tokens, stop on the checkpoint's stop ids;
  sampling seed `seed` (tunix draws every step from that one key, folded with the decode step).
- GRPOConfig: num_generations=G, num_iterations=1, beta=0 (no reference pass),
  epsilon=clip_eps, epsilon_high=clip_eps_high, loss_agg_mode="token-mean" (LoCoJAX's
  token_mean: sum over every completion token of the batch / their count). tunix's group
  std is the sample std (ddof 1); LoCoJAX's the population std (ddof 0): no option changes it.
- optimizer: optax clip_by_global_norm(grad_clip) then adamw at the constant rate (LoCoJAX's
  own chain); one optimizer update per step (mini-batch = the whole batch).
- data: one batch per step, the recipe's prompts in its order (no shuffle).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from grpo_recipe import Recipe, StepClock, check_ids, scorer  # noqa: E402
from tunix_qwen3 import tunix_config  # noqa: E402


def _model(recipe: Recipe, mesh):
    from tunix.models.qwen3 import params as params_lib

    config = tunix_config(recipe.checkpoint)
    return params_lib.create_model_from_safe_tensors(recipe.checkpoint, config, mesh), config


def _cluster(recipe: Recipe, model, tokenizer, mesh):
    """tunix's RL cluster: one mesh for actor, reference and rollout, the recipe's AdamW."""
    import optax
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.rollout import base_rollout

    optimizer = optax.chain(
        optax.clip_by_global_norm(recipe.grad_clip),
        optax.adamw(recipe.learning_rate, b1=recipe.adam_b1, b2=recipe.adam_b2,
                    eps=recipe.adam_eps, weight_decay=recipe.weight_decay),
    )
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=recipe.max_new_tokens, max_prompt_length=recipe.max_prompt_len,
        kv_cache_size=recipe.max_prompt_len + recipe.max_new_tokens,
        temperature=recipe.temperature, top_p=1.0, top_k=None, seed=recipe.seed,
        eos_tokens=recipe.stop_ids,
    )
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={role: mesh for role in (rl_cluster_lib.Role.ACTOR,
                                              rl_cluster_lib.Role.REFERENCE,
                                              rl_cluster_lib.Role.ROLLOUT)},
        rollout_engine="vanilla",
        offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optimizer, eval_every_n_steps=10**9,
            max_steps=len(recipe.steps), pbar_description=None,
        ),
        rollout_config=rollout,
    )
    return rl_cluster_lib.RLCluster(actor=model, tokenizer=tokenizer,
                                    cluster_config=cluster_config)


def _time_phases(cluster, clock: StepClock, rewards_seen: list[float]) -> None:
    """Wrap the cluster's generate (rollout_s) and actor update (the step's end) in the
    clock's phases."""
    import jax

    generate, update = cluster.generate, cluster.update_actor

    def timed_generate(*args, **kwargs):
        with clock.phase("rollout_s"):
            return generate(*args, **kwargs)

    def timed_update(*args, **kwargs):
        out = update(*args, **kwargs)
        jax.block_until_ready(jax.tree.leaves(nnx_state(cluster)))
        clock.end_step(rewards_seen[-1])
        return out

    cluster.generate, cluster.update_actor = timed_generate, timed_update


def main() -> None:
    recipe = Recipe.from_json(Path(sys.argv[1]))
    import jax
    from transformers import AutoTokenizer
    from tunix.rl.grpo import grpo_learner

    tokenizer = AutoTokenizer.from_pretrained(recipe.checkpoint)
    check_ids(recipe, lambda text: tokenizer.encode(text, add_special_tokens=False))
    auto = (jax.sharding.AxisType.Auto,) * 2  # tunix's gathers fail under explicit axes
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=auto)
    model, _ = _model(recipe, mesh)
    cluster = _cluster(recipe, model, tokenizer, mesh)
    algo = grpo_learner.GRPOConfig(
        num_generations=recipe.group_size, num_iterations=1, beta=0.0,
        epsilon=recipe.clip_eps, loss_agg_mode="token-mean",
    )
    algo.epsilon_high = recipe.clip_eps_high  # read by tunix's grpo loss when present

    clock = StepClock(Path(sys.argv[2]))
    score = scorer(recipe)
    rewards_seen: list[float] = []

    def reward_fn(prompts, completions, answer, **_):
        with clock.phase("reward_s"):
            rewards = score.score_batch(list(completions), [str(a) for a in answer]).rewards_B
        rewards_seen.append(float(np.mean(rewards)))
        return rewards.tolist()

    learner = grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo,
                                       reward_fns=[reward_fn])
    _time_phases(cluster, clock, rewards_seen)
    # Arrays, as tunix's grain pipelines give them (its repeat-by-G maps over the leaves).
    batches = [{"prompts": np.array([p.text for p in step]),
                "answer": np.array([p.answer for p in step])} for step in recipe.steps]
    clock.last = time.perf_counter()
    learner.train(batches)
    clock.close()
    score.close()


def nnx_state(cluster):
    from flax import nnx

    return nnx.state(cluster.actor_trainer.model)


if __name__ == "__main__":
    main()

"""TRL's `GRPOTrainer` on a benchmarks/grpo.py recipe (run in the peers' venv).

    PY benchmarks/grpo_trl.py RECIPE.json OUT.jsonl

What is set, against LoCoJAX's recipe (see benchmarks/grpo.py for the whole table):
- model: `AutoModelForCausalLM.from_pretrained(checkpoint, dtype=float32)`; generation through
  `transformers` `generate` (use_vllm=False), the sampling path TRL has without vLLM.
- GRPOConfig: per_device_train_batch_size = P x G completions, gradient_accumulation_steps=1,
  num_generations=G, num_iterations=1 (one optimizer update per generation batch),
  max_completion_length, temperature 1, top_p 1.0, top_k 0 (full vocabulary), beta 0 (no
  reference model), epsilon / epsilon_high = clip_eps / clip_eps_high,
  loss_type="dapo" (token mean over the whole batch: LoCoJAX's token_mean),
  scale_rewards="group" (group std, the sample std, + 1e-4), mask_truncated_completions=False.
- optimizer: adamw_torch at the constant rate (lr_scheduler_type="constant", warmup_steps=0),
  betas, eps and weight decay of the recipe, max_grad_norm = grad_clip.
- speed: use_cpu=True, bf16=False (fp32, as LoCoJAX on a CPU), gradient_checkpointing=False
  (TRL's default True trades ~20% speed for memory this model does not need), torch threads =
  the recipe's; no logging, saving or evaluation.
- data: a Dataset of the recipe's prompts in order, shuffle_dataset=False, so TRL's
  RepeatSampler hands out step s's P prompts at step s.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from grpo_recipe import Recipe, StepClock, check_ids, scorer  # noqa: E402


def main() -> None:
    recipe = Recipe.from_json(Path(sys.argv[1]))
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(recipe.threads)
    tokenizer = AutoTokenizer.from_pretrained(recipe.checkpoint, padding_side="left")
    check_ids(recipe, lambda text: tokenizer(text)["input_ids"])  # TRL's own call
    model = AutoModelForCausalLM.from_pretrained(recipe.checkpoint, dtype=torch.float32)
    rows = [{"prompt": p.text, "answer": p.answer} for step in recipe.steps for p in step]
    per_step = len(recipe.steps[0]) * recipe.group_size
    out_dir = Path(sys.argv[2]).with_suffix(".trl")
    args = GRPOConfig(
        output_dir=str(out_dir), seed=recipe.seed, use_cpu=True, bf16=False,
        gradient_checkpointing=False, per_device_train_batch_size=per_step,
        gradient_accumulation_steps=1, num_generations=recipe.group_size, num_iterations=1,
        max_completion_length=recipe.max_new_tokens, temperature=recipe.temperature,
        top_p=1.0, top_k=0, beta=0.0, epsilon=recipe.clip_eps, epsilon_high=recipe.clip_eps_high,
        loss_type="dapo", scale_rewards="group", mask_truncated_completions=False,
        learning_rate=recipe.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=recipe.adam_b1, adam_beta2=recipe.adam_b2, adam_epsilon=recipe.adam_eps,
        weight_decay=recipe.weight_decay, max_grad_norm=recipe.grad_clip,
        max_steps=len(recipe.steps), shuffle_dataset=False, logging_steps=10**9,
        report_to="none", save_strategy="no", eval_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False, remove_unused_columns=False,
    )
    clock = StepClock(Path(sys.argv[2]))
    score = scorer(recipe)
    rewards_seen: list[float] = []

    def reward(prompts, completions, answer, **_):
        rewards = score.score_batch(list(completions), [str(a) for a in answer]).rewards_B
        rewards_seen.append(float(np.mean(rewards)))
        return rewards.tolist()

    class StepEnd(TrainerCallback):
        def on_step_end(self, *_args, **_kwargs):
            clock.end_step(rewards_seen[-1])

    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                          callbacks=[StepEnd()])
    generate, rewards_fn = trainer._generate, trainer._calculate_rewards

    def timed_generate(*a, **k):
        with clock.phase("rollout_s"):
            return generate(*a, **k)

    def timed_rewards(*a, **k):
        with clock.phase("reward_s"):
            return rewards_fn(*a, **k)

    trainer._generate, trainer._calculate_rewards = timed_generate, timed_rewards
    clock.last = time.perf_counter()
    trainer.train()
    clock.close()
    score.close()


if __name__ == "__main__":
    main()

"""The GRPO recipe every framework of benchmarks/grpo.py runs, and the per-step timing rows.

Plain Python (stdlib only): the LoCoJAX process writes a `Recipe` as JSON, and the peers' runners
(benchmarks/grpo_tunix.py, benchmarks/grpo_trl.py, in the peers' venv) read it. Each runner
writes one JSON row per GRPO step: {"step", "reward_mean", "step_s", "rollout_s", "reward_s",
"train_s"}, where train_s is the rest of the step (advantages, log-probs, backward, update).
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Prompt:
    """One prompt as every framework sees it: rendered text, its token ids, the answer."""

    text: str
    ids: list[int]
    """LoCoJAX's ids of `text`; each peer checks its own tokenizer gives exactly these."""
    answer: str


@dataclass(frozen=True)
class Recipe:
    """Everything a framework needs to run the same GRPO steps from the same weights."""

    case: str
    """`speed` or `learning`."""
    checkpoint: str
    """HF checkpoint directory: config.json, model.safetensors and the tokenizer files."""
    steps: list[list[Prompt]]
    """The prompts of each step, in LoCoJAX's order for `seed`."""
    group_size: int
    max_prompt_len: int
    max_new_tokens: int
    temperature: float
    learning_rate: float
    """Constant: no warm-up, no decay (the one schedule every framework has alike)."""
    adam_b1: float
    adam_b2: float
    adam_eps: float
    weight_decay: float
    grad_clip: float
    clip_eps: float
    clip_eps_high: float
    format_reward: float
    """Reward of a well-formed wrong answer (LoCoJAX's scorer; correct = 1)."""
    seed: int
    threads: int
    """CPU threads every framework is given."""
    stop_ids: list[int] = field(default_factory=list)

    def to_json(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @staticmethod
    def from_json(path: Path) -> Recipe:
        raw = json.loads(Path(path).read_text())
        raw["steps"] = [[Prompt(**p) for p in step] for step in raw["steps"]]
        return Recipe(**raw)


def check_ids(recipe: Recipe, encode) -> None:
    """Raise unless `encode(text)` gives LoCoJAX's ids for every prompt of the recipe."""
    for i, step in enumerate(recipe.steps):
        for p in step:
            got = list(encode(p.text))
            if got != p.ids:
                raise SystemExit(f"tokenizer mismatch at step {i}: {p.text[:60]!r} -> "
                                 f"{got[:12]}... vs LoCoJAX {p.ids[:12]}...")


class StepClock:
    """Phase times of each step; a step ends when the framework's update returns."""

    def __init__(self, out: Path):
        self.out = Path(out).open("w")
        self.phases: dict[str, float] = {"rollout_s": 0.0, "reward_s": 0.0}
        self.last = time.perf_counter()
        self.step = 0

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] += time.perf_counter() - start

    def end_step(self, reward_mean: float) -> None:
        now = time.perf_counter()
        step_s = now - self.last
        row = {"step": self.step, "reward_mean": float(reward_mean), "step_s": step_s,
               **self.phases}
        row["train_s"] = max(step_s - row["rollout_s"] - row["reward_s"], 0.0)
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()
        self.phases = dict.fromkeys(self.phases, 0.0)
        self.last, self.step = now, self.step + 1

    def close(self) -> None:
        self.out.close()


def scorer(recipe: Recipe):
    """LoCoJAX's own GSM8K-answer scorer (correct 1, formatted `format_reward`), for the peers."""
    import sys

    sys.path.insert(0, str(REPO))  # locojax.rewards needs only numpy
    from locojax.rewards import RewardSettings, Scorer

    return Scorer(RewardSettings(format_reward=recipe.format_reward))

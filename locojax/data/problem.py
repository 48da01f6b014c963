"""One prompt with its reference answer, the settings of a workload, and data errors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from compiler.vocab import RewardKind


class DataError(RuntimeError):
    """A workload's data cannot be loaded; the one-line message says what to set."""


@dataclass(frozen=True, slots=True)
class Problem:
    """A question, its reference answer and, where the data has one, the worked solution."""

    uid: str
    """Stable id: `<workload>/<split>/<row>`."""
    question: str
    """Problem text, before the prompt template."""
    answer: str
    """Reference final answer the reward compares with (a number, or a boxed expression)."""
    solution: str | None = None
    """Full reference solution, ending in the answer in the reward's format (for SFT)."""


@dataclass(frozen=True)
class ArithSettings:
    """Difficulty knobs of the generated arithmetic workload (config `workload.arith`)."""

    min_operand: int = 0
    max_operand: int = 9
    terms: int = 2
    ops: str = "+"
    train_size: int = 100_000
    eval_size: int = 256


@dataclass(frozen=True)
class WorkloadSettings:
    """Where a workload's prompts come from (mirrors the config's `workload` group)."""

    name: str = "arith"
    """`arith` (generated), `gsm8k` or `numina_cot`; also the uid prefix."""
    dataset: str = ""
    """Hub data set name, used when `data_dir` is None."""
    dataset_config: str | None = None
    """Hub data set configuration (GSM8K: `main`)."""
    data_dir: str | None = None
    """Directory of `<split>.jsonl` files, or one jsonl file serving every split."""
    train_split: str = "train"
    eval_split: str = "test"
    question_field: str = "question"
    answer_field: str = "answer"
    """Field holding the reference solution; the answer is extracted from it."""
    reward: RewardKind = RewardKind.gsm8k
    """`gsm8k`: the answer follows `####`; `boxed`: it is the last `\\boxed{}`."""
    prompt_template: str = "{question}"
    arith: ArithSettings = field(default_factory=ArithSettings)


def render_prompt(problem: Problem, template: str, chat: Callable[[str], str] | None = None) -> str:
    """Fill the template's `{question}`, then wrap it with `chat` (a chat template) if given."""
    try:
        text = template.format(question=problem.question)
    except (KeyError, IndexError, ValueError) as e:
        raise DataError(
            f"workload.prompt_template={template!r} must use only {{question}} "
            f"(write {{{{ }}}} for a literal brace): {type(e).__name__}: {e}"
        ) from e
    return chat(text) if chat is not None else text

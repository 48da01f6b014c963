"""One prompt with its reference answer, the settings of a workload, and data errors.

The settings mirror the schema's `workload` section and take their defaults from its defaults
(`compiler.sections`), so each default is written once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from compiler.sections import ArithConfig, ReasoningGymConfig, WorkloadConfig
from compiler.vocab import RewardKind

_ARITH, _GYM, _WORKLOAD = ArithConfig(), ReasoningGymConfig(), WorkloadConfig()


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
    columns: dict | None = None
    """The row's other columns, passed to reward functions of the user's (`reward=python`)."""
    messages: tuple[tuple[str, str], ...] | None = None
    """(role, content) of each message of a row in chat form (`workload.messages_field`);
    `question` is then its last user message."""
    reference: tuple[tuple[str, str], ...] | None = None
    """(role, content) of a reference episode after its opening (assistant replies, tool or
    user messages between them, an assistant's last): what the supervised warm-up of a
    multi-turn run trains on, where the run has every tool the replies call."""


@dataclass(frozen=True)
class ArithSettings:
    """Difficulty knobs of the generated arithmetic workload (config `workload.arith`)."""

    min_operand: int = _ARITH.min_operand
    max_operand: int = _ARITH.max_operand
    terms: int = _ARITH.terms
    ops: str = _ARITH.ops
    train_size: int = _ARITH.train_size
    eval_size: int = _ARITH.eval_size


@dataclass(frozen=True)
class GymSettings:
    """A reasoning-gym task as the workload's rows (config `workload.reasoning_gym`)."""

    task: str = _GYM.task
    size: int = _GYM.size
    eval_size: int = _GYM.eval_size
    seed: int = _GYM.seed


@dataclass(frozen=True)
class WorkloadSettings:
    """Where a workload's prompts come from (mirrors the config's `workload` group)."""

    name: str = _WORKLOAD.name
    """`arith` (generated), `gsm8k` or `numina_cot`; also the uid prefix."""
    dataset: str = _WORKLOAD.dataset
    """Hub data set name, used when `data_dir` is None."""
    dataset_config: str | None = _WORKLOAD.dataset_config
    """Hub data set configuration (GSM8K: `main`)."""
    data_dir: str | None = _WORKLOAD.data_dir
    """Directory of `<split>.jsonl` files, or one jsonl file serving every split."""
    train_split: str = _WORKLOAD.train_split
    eval_split: str = _WORKLOAD.eval_split
    question_field: str = _WORKLOAD.question_field
    answer_field: str = _WORKLOAD.answer_field
    messages_field: str | None = _WORKLOAD.messages_field
    """Field holding the prompt as chat messages, instead of `question_field`."""
    """Field holding the reference solution; the answer is extracted from it (as it is with
    `reward=python`, where it may also be absent)."""
    data_files: dict[str, str] = field(default_factory=dict)
    """Split (`train`, `eval`) -> a local JSONL, JSON, Parquet or CSV file."""
    eval_fraction: float = _WORKLOAD.eval_fraction
    max_row_bytes: int = _WORKLOAD.max_row_bytes
    """Rows whose JSON text is larger are skipped and counted."""
    """With no `eval` file: the share of train rows held out (the same rows every run)."""
    reward: RewardKind = _WORKLOAD.reward
    """`gsm8k`: the answer follows `####`; `boxed`: it is the last `\\boxed{}`."""
    prompt_template: str = _WORKLOAD.prompt_template
    env: str = _WORKLOAD.env
    """A hub's environment (`verifiers:...`, `openenv:...`: `locojax.hubs`) brings the rows."""
    env_args: dict[str, str] = field(default_factory=dict)
    """The hub environment's settings (`workload.env_args`)."""
    columns: bool = False
    """Keep every column of a row in `Problem.columns` with a built-in reward too (an
    environment of the user's reads them: `workload.env`)."""
    arith: ArithSettings = field(default_factory=ArithSettings)
    reasoning_gym: GymSettings = field(default_factory=GymSettings)


def render_prompt(problem: Problem, template: str, chat: Callable[[str], str] | None = None,
                  chat_messages: Callable[[list[dict]], str] | None = None) -> str:
    """Fill the template's `{question}`, then wrap it with `chat` (a chat template) if given.

    A row in chat form renders its messages through `chat_messages` (the chat template), or
    without one is its last user message (what reward functions get as the prompt)."""
    if problem.messages is not None:
        if chat_messages is None:
            return problem.question
        return chat_messages([{"role": r, "content": c} for r, c in problem.messages])
    try:
        text = template.format(question=problem.question)
    except (KeyError, IndexError, ValueError) as e:
        raise DataError(
            f"workload.prompt_template={template!r} must use only {{question}} "
            f"(write {{{{ }}}} for a literal brace): {type(e).__name__}: {e}"
        ) from e
    return chat(text) if chat is not None else text

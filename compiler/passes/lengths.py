"""The token lengths the layout passes size against, computed once per compile."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.config import SamplingConfig, WorkloadConfig


@dataclass(frozen=True)
class Lengths:
    """Tokens of a prompt, of a completion, and of the two together (the engine's and the
    trainer's static shapes)."""

    prompt: int
    """`workload.max_prompt_len`."""
    response: int
    """A train row's tokens after the prompt: one reply (`sampling.max_new_tokens` when set,
    else `workload.max_response_len`), or with an environment or tools the whole episode
    (`episode_len`)."""

    @property
    def seq(self) -> int:
        """Prompt and response: one row's length."""
        return self.prompt + self.response


def multi_turn(workload: WorkloadConfig) -> bool:
    """Whether the workload's episodes are turns with an environment or tools."""
    return bool(workload.env or workload.tools)


def reply_len(workload: WorkloadConfig, sampling: SamplingConfig) -> int:
    """Tokens of one reply: `sampling.max_new_tokens` when set, else `max_response_len`."""
    return sampling.max_new_tokens or workload.max_response_len


def episode_len(workload: WorkloadConfig, sampling: SamplingConfig) -> int:
    """Tokens of an episode after its prompt: `max_episode_len`, or by default room for
    max_turns replies and, between them, environment messages as long as a prompt."""
    turns = workload.max_turns
    return workload.max_episode_len or (turns * reply_len(workload, sampling)
                                         + (turns - 1) * workload.max_prompt_len)


def cache_len(workload: WorkloadConfig, sampling: SamplingConfig) -> int:
    """Columns of a multi-turn episode's KV cache: its prompt, its episode's tokens and one
    reply (written before its end is known)."""
    return workload.max_prompt_len + episode_len(workload, sampling) + reply_len(workload,
                                                                                  sampling)


def lengths(workload: WorkloadConfig, sampling: SamplingConfig) -> Lengths:
    """The lengths a workload and its sampling settings give every row."""
    response = (episode_len(workload, sampling) if multi_turn(workload)
                else reply_len(workload, sampling))
    return Lengths(workload.max_prompt_len, response)

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
    """`sampling.max_new_tokens` when set, else `workload.max_response_len`."""

    @property
    def seq(self) -> int:
        """Prompt and response: one row's length."""
        return self.prompt + self.response


def lengths(workload: WorkloadConfig, sampling: SamplingConfig) -> Lengths:
    """The lengths a workload and its sampling settings give every row."""
    return Lengths(workload.max_prompt_len, sampling.max_new_tokens or workload.max_response_len)

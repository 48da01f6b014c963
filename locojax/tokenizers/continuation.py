"""A chat template's turn boundaries, found by rendering it: how an episode continues in a
checkpoint's own template (Qwen2.5's, Llama 3's, Gemma 3's, ...) after the model's reply.

    probe = [user PROBE_USER, assistant MARK]
    render(probe, no generation prompt) = HEAD + MARK + END_TEXT   ("<|eot_id|>",
                                                                    "<end_of_turn>\\n", ...)
    end token: the first token of END_TEXT, one of the tokenizer's stop ids (what a reply cut
        at its length is closed with, as the model would have closed it)
    continuation(messages) = render(probe + messages, generation prompt)
                             with its prefix HEAD + MARK + <the end token's text> removed
        (the environment's messages and the next generation prompt, in the template's words)

A template whose rendering of a growing conversation does not start with its rendering of
the shorter one (one that rewrites earlier turns) has no continuation: `ValueError`, one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from locojax.tokenizers.base import Tokenizer

PROBE_USER = "Hello."
"""The probe conversation's user message."""
MARK = "\u2063reply\u2063"
"""The probe's assistant reply: text no template adds or changes (invisible separators)."""


@dataclass(frozen=True)
class TemplateTurns:
    """Where a tokenizer's chat template ends a turn and how it continues one."""

    tokenizer: Tokenizer
    end_id: int
    """The token that ends the model's turn in this template."""
    prefix: str
    """The probe's rendering up to and including the end token's text."""
    thinking: bool
    tools: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, tokenizer: Tokenizer, thinking: bool,
           tools: Sequence[Mapping[str, Any]] = ()) -> TemplateTurns:
        """The turns of `tokenizer`'s chat template (with `tools` in its tools block). Raises
        ValueError (one line) when the template has no end-of-turn token among the
        tokenizer's stop ids, or when it rewrites a conversation as it grows."""
        head = tokenizer.chat(_probe(), add_generation_prompt=False, enable_thinking=thinking,
                              tools=list(tools) or None)
        if MARK not in head:
            raise ValueError("the chat template does not write an assistant reply as given")
        at = head.rindex(MARK) + len(MARK)
        ids = tokenizer.encode(head[at:])
        if not ids or ids[0] not in tokenizer.stop_ids:
            raise ValueError(f"the chat template ends a reply with {head[at:at + 24]!r}, which "
                             "does not start with one of the tokenizer's stop tokens")
        end = tokenizer.decode([ids[0]], skip_special=False)
        turns = cls(tokenizer, ids[0], head[:at] + end, thinking, tuple(tools))
        turns.continuation([{"role": "user", "content": PROBE_USER}])  # grows, or raises
        return turns

    def continuation(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The text after a reply's end token: `messages` (the environment's) and the next
        generation prompt, as the template writes them after the probe. Raises ValueError
        when the template rewrites the probe once the messages follow it."""
        text = self.tokenizer.chat([*_probe(), *messages], add_generation_prompt=True,
                                   enable_thinking=self.thinking,
                                   tools=list(self.tools) or None)
        if not text.startswith(self.prefix):
            raise ValueError("the chat template writes earlier turns differently once an "
                             "episode grows, so its transcript cannot be continued")
        return text[len(self.prefix):]


def _probe() -> list[dict[str, str]]:
    return [{"role": "user", "content": PROBE_USER}, {"role": "assistant", "content": MARK}]

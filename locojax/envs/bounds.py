"""What the model reads of its tools: at most `workload.max_tool_calls` calls run from one reply
and at most `workload.max_tool_result_tokens` tokens of one result, each cut counted.

    tool worker: fn(**arguments) ──tool_result_text──> text ──sent_text──> at most
                 `CHARS_PER_TOKEN` x max_tokens + 1 characters (the socket never carries more)
    runner:      reply's calls ──capped──> the first max_calls run, `dropped_message` for the rest
    host:        result ──bounded_result (the run's tokenizer)──> its first max_tokens tokens
                 and `CUT_MARK`, or the result as it is

A result of any size costs the host no more than `CHARS_PER_TOKEN` x max_tokens characters and
one tokenisation of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from locojax.tokenizers.base import Tokenizer

T = TypeVar("T")

CHARS_PER_TOKEN = 16
"""Characters of a result the tool's worker sends per token the model may read: more than any
token of the built-in and Hugging Face vocabularies holds on average over a text."""
CUT_MARK = "\n[cut: the result was longer than workload.max_tool_result_tokens={n}]"
"""Ends a result cut to `n` tokens (letters, digits and punctuation only: every built-in
tokenizer that writes the turn format encodes it)."""


def sent_text(text: str, max_tokens: int) -> str:
    """What a tool's worker sends of its result `text` (max_tokens 0: all of it): at most
    `CHARS_PER_TOKEN` x max_tokens characters, and one more when there were more (so the
    host knows it was cut)."""
    limit = CHARS_PER_TOKEN * max_tokens
    return text if max_tokens <= 0 or len(text) <= limit else text[:limit + 1]


def bounded_result(text: str, tokenizer: Tokenizer, max_tokens: int) -> tuple[str, bool]:
    """(the result the model reads, whether it was cut): `text` when it holds at most
    `max_tokens` tokens (and was not cut by its worker), else its first `max_tokens` tokens
    and `CUT_MARK`."""
    limit = CHARS_PER_TOKEN * max_tokens
    cut = len(text) > limit
    ids = tokenizer.backend.encode(text[:limit], add_special_tokens=False).ids
    if not cut and len(ids) <= max_tokens:
        return text, False
    return tokenizer.decode(ids[:max_tokens], skip_special=False) + CUT_MARK.format(
        n=max_tokens), True


def capped(calls: Sequence[T], max_calls: int) -> tuple[list[T], int]:
    """(the first `max_calls` of a reply's calls, how many are dropped; max_calls 0: none)."""
    if max_calls <= 0 or len(calls) <= max_calls:
        return list(calls), 0
    return list(calls[:max_calls]), len(calls) - max_calls


def dropped_message(dropped: int, max_calls: int) -> str:
    """The tool message the model reads for the calls of a reply past `max_calls`."""
    return (f"error: {dropped} more tool calls in this reply were not run "
            f"(workload.max_tool_calls={max_calls})")

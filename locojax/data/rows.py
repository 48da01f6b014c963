"""The prompt and answer of one data row: a question field, or messages already in chat form.

    row ──question_field──> the question (a non-empty string)
        ──messages_field──> [{role, content}, ...]: the prompt is every message but a final
            assistant one; the question is the last user message; the answer is
            answer_field's value, else that final assistant message's content

A row that does not fit is a reason (a string): the caller counts it and skips it; so is a
row larger than `workload.max_row_bytes` (its JSON text in UTF-8).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from locojax.data.problem import WorkloadSettings
from locojax.data.sources import BadLine

ROLES = ("system", "user", "assistant")
"""Message roles the chat template renders."""


@dataclass(frozen=True)
class RowPrompt:
    """What a row asks and, where it says, its reference answer or solution."""

    question: str
    """The question (or the last user message of a row in chat form)."""
    messages: tuple[tuple[str, str], ...] | None
    """(role, content) of the prompt's messages, for a row in chat form."""
    answer: str | None
    """answer_field's value if a non-empty string, else a final assistant message's."""


def _messages(value: object, field: str) -> tuple[tuple[tuple[str, str], ...], str | None] | str:
    """(the prompt's messages, the final assistant message's content), or why not."""
    if not isinstance(value, list) or not value:
        return f"field {field!r} is {type(value).__name__}, not a list of messages"
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES \
                or not isinstance(m.get("content"), str):
            return (f"field {field!r} message {i} is not {{role: {'|'.join(ROLES)}, content: "
                    f"<str>}}")
        out.append((m["role"], m["content"]))
    last = out.pop()[1] if out[-1][0] == "assistant" else None
    if not any(r == "user" and c.strip() for r, c in out):
        return f"field {field!r} has no user message before the answer"
    return tuple(out), last


def _over(row: dict, limit: int) -> int:
    """The row's size in bytes (its JSON text, UTF-8) when over `limit`, else 0. A row of
    short strings and scalars is let through without writing it out (a UTF-8 character is at
    most 4 bytes, a scalar's JSON at most 64); one holding lists or objects is measured."""
    if not any(isinstance(v, list | tuple | dict) for v in row.values()):
        bound = sum(4 * len(v) if isinstance(v, str) else 64 for v in row.values())
        if bound + sum(4 * len(str(k)) + 8 for k in row) <= limit:
            return 0
    size = len(json.dumps(row, ensure_ascii=False, default=str).encode())
    return size if size > limit else 0


def row_prompt(row: object, settings: WorkloadSettings) -> RowPrompt | str:
    """The row's prompt and answer, or why the row cannot be one (it is skipped)."""
    if isinstance(row, BadLine):
        return str(row)
    if not isinstance(row, dict):
        return "not a JSON object"
    if size := _over(row, settings.max_row_bytes):
        return f"{size:,} bytes, over workload.max_row_bytes={settings.max_row_bytes}"
    answer = row.get(settings.answer_field)
    answer = answer if isinstance(answer, str) and answer.strip() else None
    field = settings.messages_field
    if field is None:
        value = row.get(settings.question_field)
        if not isinstance(value, str) or not value.strip():
            name = settings.question_field
            return f"field {name!r} is {type(value).__name__ if name in row else 'missing'}"
        return RowPrompt(value, None, answer)
    if field not in row:
        return f"field {field!r} is missing"
    got = _messages(row[field], field)
    if isinstance(got, str):
        return got
    messages, last = got
    question = next(c for r, c in reversed(messages) if r == "user" and c.strip())
    return RowPrompt(question, messages, answer if answer is not None else last)

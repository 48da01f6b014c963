"""The plain turn format: messages as text for a tokenizer without a chat template.

    messages, tools ──render_plain──> text

    System: Tools: add(a, b)         one line per tool (its name and parameters), first
    System: Answer briefly.          then each message as `{Role}: {content}` and a newline,
    User: What is 2+3?                  Role one of System, User, Assistant, Tool
    Assistant: <tool_call>...</tool_call>
    Tool: 5
    Assistant:                       the generation prompt, `Assistant: ` (a space, no newline)

Apart from the messages' contents and the tools' names, the format uses letters, digits, `:`,
`(`, `)`, `,`, spaces and newlines only, so small tokenizers (e.g. a character-level one with
a short alphabet extended by these) can carry it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ROLES = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
"""A message's role -> its name at the start of the line."""
GENERATION_PROMPT = "Assistant: "
"""What the text ends with: the model's turn starts here."""


def tool_line(tool: Mapping[str, Any]) -> str:
    """`name(arg, ...)` of a tool schema (`envs.tools.tool_schema`'s form)."""
    fn = tool["function"]
    return f"{fn['name']}({', '.join(fn['parameters']['properties'])})"


def render_plain(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> str:
    """The tools' lines, each message's line and the generation prompt (see the module
    docstring). Raises ValueError on a role other than system, user, assistant and tool."""
    lines = [f"{ROLES['system']}: Tools: {tool_line(t)}\n" for t in tools or ()]
    for i, m in enumerate(messages):
        role = ROLES.get(m.get("role"))
        if role is None:
            raise ValueError(f"message {i}: role {m.get('role')!r} not in {tuple(ROLES)}")
        content = m.get("content")
        lines.append(f"{role}: {content if isinstance(content, str) else ''}\n")
    return "".join(lines) + GENERATION_PROMPT

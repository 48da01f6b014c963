"""How a model calls tools, by its chat template's family (`ToolFormat`), one record each.

    template rendered with a probe tool ──tool_format_of──> ToolFormat
        writes `<tool_call>` (Qwen2.5, Qwen3, SmolLM3)        -> qwen
        lists the tools, no tags (Llama 3.x: JSON, `parameters`) -> llama3
        ignores `tools` (Gemma 3, SmolLM2)                    -> plain
    FORMATS[format]: how a reply's calls are parsed, the role a tool's result is given as,
        whether the environment's messages after a reply are merged into one user message
        (templates that allow only alternating user and assistant turns) and whether the
        opening describes the tools itself (`plain`: the template has no tools block)

The plain format, for templates without one (docs/multiturn.md): a system message listing
each tool as `name(arg, ...)` and asking for `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`; each result comes back in a user message as `Tool result: <text>`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from locojax.envs.tools import ToolCall, parse_tool_calls
from locojax.envs.turns import tool_line


class ToolFormat(StrEnum):
    """The tool-call convention of a chat template."""

    qwen = "qwen"
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Hermes style)."""
    llama3 = "llama3"
    """The reply is a JSON object `{"name": ..., "parameters": {...}}` (Llama 3.x's
    template's own instruction; `arguments` accepted too), after an optional
    `<|python_tag|>`; several separated by `;`."""
    plain = "plain"
    """The template has no tools block: LoCoJAX's system message describes the tools and
    the `qwen` call syntax, results return as `Tool result: ...` user messages."""


def parse_json_calls(reply: str) -> tuple[list[ToolCall], int]:
    """(the calls of a Llama-3-style reply, malformed ones): a reply that starts with `{`
    (after whitespace and an optional `<|python_tag|>`) is one or more JSON objects with a
    string `name` and an object `parameters` (or `arguments`), separated by `;`; any other
    reply calls nothing."""
    text = reply.strip().removeprefix("<|python_tag|>").strip()
    if not text.startswith("{"):
        return [], 0
    calls, malformed = [], 0
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        try:
            obj = json.loads(part)
        except (ValueError, RecursionError):
            malformed += 1
            continue
        args = obj.get("parameters", obj.get("arguments")) if isinstance(obj, dict) else None
        name = obj.get("name") if isinstance(obj, dict) else None
        if isinstance(name, str) and name and isinstance(args, dict):
            calls.append(ToolCall(name, args))
        else:
            malformed += 1
    return calls, malformed


@dataclass(frozen=True)
class CallFormat:
    """One tool-call convention (`FORMATS`)."""

    parse: Callable[[str], tuple[list[ToolCall], int]]
    """A reply -> (its well-formed calls, its malformed ones)."""
    merged: bool
    """The messages after a reply become one user message (tool results as `Tool result:
    <text>` lines): for templates that refuse a `tool` role or two user turns in a row."""
    describes_tools: bool
    """The opening carries LoCoJAX's own tools message (`tools_message`)."""


FORMATS = {
    ToolFormat.qwen: CallFormat(parse_tool_calls, merged=False, describes_tools=False),
    ToolFormat.llama3: CallFormat(parse_json_calls, merged=False, describes_tools=False),
    ToolFormat.plain: CallFormat(parse_tool_calls, merged=True, describes_tools=True),
}

PROBE_TOOL = {"type": "function", "function": {
    "name": "probe_tool", "description": "A probe.",
    "parameters": {"type": "object", "properties": {"x": {"type": "integer",
                                                          "description": "A number."}},
                   "required": ["x"]}}}
"""The tool a template is rendered with to see its convention (`tool_format_of`)."""


def tool_format_of(render: Callable[[list[dict] | None], str]) -> ToolFormat:
    """The convention of a template, from `render(tools)`: its rendering of one user message
    with `tools` (None: without)."""
    with_tools = render([PROBE_TOOL])
    if with_tools == render(None):
        return ToolFormat.plain
    return ToolFormat.qwen if "<tool_call>" in with_tools else ToolFormat.llama3


def tools_message(tools: Sequence[Mapping[str, Any]]) -> str:
    """The plain format's description of `tools` and of how to call them."""
    lines = "\n".join(tool_line(t) for t in tools)
    return (f"You may call these tools:\n{lines}\nTo call one, write <tool_call>"
            '{"name": <tool name>, "arguments": {...}}</tool_call>; each result comes back '
            "as a message starting with 'Tool result:'.")


def merged(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    """The environment's messages after a reply as one user message (tool results as
    `Tool result: <text>`)."""
    parts = [f"Tool result: {m.get('content')}" if m.get("role") == "tool"
             else str(m.get("content")) for m in messages]
    return [{"role": "user", "content": "\n".join(parts)}] if parts else []

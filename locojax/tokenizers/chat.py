"""Qwen3's chat template (system, user, assistant and tool turns; a tools block) as plain Python.

    messages, tools ──apply_chat_template──> text (the same as Qwen3's own Jinja template)

    <|im_start|>system\\n{system}\\n\\n# Tools ... <tools>\\n{tool JSON, one a line}\\n</tools>
        ... </tool_call><|im_end|>\\n                 (only with tools; `{system}\\n\\n` only
                                                      when the first message is a system one)
    <|im_start|>system\\n{system}<|im_end|>\\n        (no tools, a first system message)
    <|im_start|>{role}\\n{content}<|im_end|>\\n       (user and later system turns)
    <|im_start|>assistant\\n{content}{tool calls}<|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{tool}\\n</tool_response>\\n<tool_response>...
        </tool_response><|im_end|>\\n                 (consecutive tool messages: one turn)
    <|im_start|>assistant\\n[<think>\\n\\n</think>\\n\\n]   (the generation prompt; the empty
                                                      think block when thinking is off)

Assistant turns after the last user query keep their reasoning as `<think>\\n...\\n</think>\\n\\n`;
earlier ones lose it. A user turn that only wraps a `<tool_response>` is no query. Our tool calls
live in the assistant's content; an OpenAI-style `tool_calls` field is rendered as Qwen3 renders
it, so that a client of an exported checkpoint chats as with Qwen3. Tool JSON is `json.dumps`
with `ensure_ascii=False`, as transformers' `tojson`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

_ROLES = ("system", "user", "assistant", "tool")

TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
"""The tools block up to the schemas (Qwen3's wording)."""
TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
"""The tools block after the schemas: how to call one (Qwen3's wording)."""

CHAT_TEMPLATE_JINJA = r"""{%- set ns = namespace(multi_step_tool=true,
                       last_query_index=messages|length - 1) %}
{%- set opening = messages[0] if messages else none %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if opening and opening.role == 'system' %}
        {{- (opening.content if opening.content is string else '') + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' }}
    {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif opening and opening.role == 'system' %}
    {{- '<|im_start|>system\n' + (opening.content if opening.content is string else '') }}
    {{- '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == 'user' and message.content is string
          and not (message.content.startswith('<tool_response>')
                   and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'assistant' %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n')
                                        .split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning_content.strip('\n') }}
            {{- '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {%- for call in message.tool_calls or [] %}
            {%- set fn = call.function if call.function else call %}
            {%- if content or not loop.first %}
                {{- '\n' }}
            {%- endif %}
            {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' }}
            {{- fn.arguments if fn.arguments is string else fn.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- elif not (loop.first and message.role == 'system') %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""
"""`apply_chat_template` as the Jinja template HF tokenizers carry (`tokenizer_config.json`'s
`chat_template`; Qwen3's own), so an export chats the same in transformers, vLLM and SGLang
(tests render both, with transformers' `tojson`)."""


def _content(message: Mapping[str, Any]) -> str:
    """The message's text; '' when it has none (or not a string), as Qwen3's template."""
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _split_reasoning(content: str) -> tuple[str, str]:
    """(reasoning, answer) of an assistant message whose text contains `</think>`."""
    if "</think>" not in content:
        return "", content
    before, _, _ = content.partition("</think>")
    reasoning = before.rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning, content.split("</think>")[-1].lstrip("\n")


def _is_query(message: Mapping[str, Any]) -> bool:
    """A user turn with string content that is not only a wrapped tool response."""
    content = message.get("content")
    if message["role"] != "user" or not isinstance(content, str):
        return False
    return not (content.startswith("<tool_response>") and content.endswith("</tool_response>"))


def _tool_calls(message: Mapping[str, Any], content: str) -> str:
    """An OpenAI-style `tool_calls` field as Qwen3 renders it after the content."""
    parts = []
    for k, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or call
        args = fn.get("arguments")
        args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        sep = "\n" if content or k else ""
        call_json = f'{{"name": "{fn["name"]}", "arguments": {args}}}'
        parts.append(f"{sep}<tool_call>\n{call_json}\n</tool_call>")
    return "".join(parts)


def _assistant(message: Mapping[str, Any], after_last_query: bool, last: bool) -> str:
    content = _content(message)
    reasoning = message.get("reasoning_content")
    if not isinstance(reasoning, str):
        reasoning, content = _split_reasoning(content)
    if after_last_query and (last or reasoning):
        body = f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n{content.lstrip(chr(10))}"
    else:
        body = content
    return f"<|im_start|>assistant\n{body}{_tool_calls(message, content)}<|im_end|>\n"


def _tool_response(messages: Sequence[Mapping[str, Any]], i: int) -> str:
    """Tool message `i`: consecutive tool messages share one user turn."""
    first = i == 0 or messages[i - 1]["role"] != "tool"
    last = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
    response = f"\n<tool_response>\n{_content(messages[i])}\n</tool_response>"
    return ("<|im_start|>user" if first else "") + response + ("<|im_end|>\n" if last else "")


def _system(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping] | None) -> str:
    """The opening system turn: the first system message's content, then the tools block."""
    system = _content(messages[0]) if messages and messages[0]["role"] == "system" else None
    if not tools:
        return "" if system is None else f"<|im_start|>system\n{system}<|im_end|>\n"
    listed = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    head = "" if system is None else system + "\n\n"
    return f"<|im_start|>system\n{head}{TOOLS_INTRO}{listed}{TOOLS_OUTRO}<|im_end|>\n"


def apply_chat_template(
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    enable_thinking: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """Render `messages` (dicts with `role` and `content`) and `tools` (schemas, e.g.
    `envs.tools.tool_schema`'s) exactly as Qwen3's template does. Raises ValueError on a role
    other than system, user, assistant and tool."""
    for i, m in enumerate(messages):
        if m.get("role") not in _ROLES:
            raise ValueError(f"message {i}: role {m.get('role')!r} not in {_ROLES}")
    queries = [i for i, m in enumerate(messages) if _is_query(m)]
    last_query = queries[-1] if queries else len(messages) - 1
    parts = [_system(messages, tools)]
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            parts.append(_assistant(m, i > last_query, i == len(messages) - 1))
        elif m["role"] == "tool":
            parts.append(_tool_response(messages, i))
        elif i > 0 or m["role"] != "system":  # a first system message opens the text
            parts.append(f"<|im_start|>{m['role']}\n{_content(m)}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
        if not enable_thinking:
            parts.append("<think>\n\n</think>\n\n")
    return "".join(parts)

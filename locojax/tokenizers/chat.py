"""Qwen3's chat template (system, user and assistant turns; no tools) as plain Python.

Each turn is `<|im_start|>{role}\\n{content}<|im_end|>\\n`. Assistant turns after the last user
turn keep their reasoning as `<think>\\n...\\n</think>\\n\\n`; earlier ones lose it, as in Qwen3.
The generation prompt is `<|im_start|>assistant\\n`, followed by an empty think block
`<think>\\n\\n</think>\\n\\n` when thinking is switched off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

_ROLES = ("system", "user", "assistant")

CHAT_TEMPLATE_JINJA = (
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == 'user' and message.content is string"
    " and not (message.content.startswith('<tool_response>')"
    " and message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- set content = message.content if message.content is string else '' %}\n"
    "    {%- if message.role == 'assistant' %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is string %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- elif '</think>' in content %}\n"
    "            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')"
    ".split('<think>')[-1].lstrip('\\n') %}\n"
    "            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}\n"
    "            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n')"
    " + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>assistant\\n' + content }}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
)
"""`apply_chat_template` as the Jinja template HF tokenizers carry (`tokenizer_config.json`'s
`chat_template`; Qwen3's own, without tools), so an export chats the same in transformers,
vLLM and SGLang (a test renders both)."""


def _split_reasoning(content: str) -> tuple[str, str]:
    """(reasoning, answer) of an assistant message whose text contains `</think>`."""
    if "</think>" not in content:
        return "", content
    before, _, _ = content.partition("</think>")
    reasoning = before.rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning, content.split("</think>")[-1].lstrip("\n")


def _is_tool_reply(message: Mapping[str, str]) -> bool:
    content = message.get("content", "")
    return content.startswith("<tool_response>") and content.endswith("</tool_response>")


def _assistant(message: Mapping[str, str], after_last_query: bool, last: bool) -> str:
    content = message.get("content", "")
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning, content = _split_reasoning(content)
    if after_last_query and (last or reasoning):
        reasoning, content = reasoning.strip("\n"), content.lstrip("\n")
        body = f"<think>\n{reasoning}\n</think>\n\n{content}"
    else:
        body = content
    return f"<|im_start|>assistant\n{body}<|im_end|>\n"


def apply_chat_template(
    messages: Sequence[Mapping[str, str]],
    add_generation_prompt: bool = True,
    enable_thinking: bool = True,
) -> str:
    """Render `messages` (dicts with `role` and `content`) exactly as Qwen3's template does."""
    for i, m in enumerate(messages):
        if m.get("role") not in _ROLES:
            raise ValueError(f"message {i}: role {m.get('role')!r} not in {_ROLES}")
    # Qwen3 does not count user turns that only carry a tool response as queries.
    users = [i for i, m in enumerate(messages) if m["role"] == "user" and not _is_tool_reply(m)]
    last_query = users[-1] if users else len(messages) - 1
    parts = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            parts.append(_assistant(m, i > last_query, i == len(messages) - 1))
        else:
            parts.append(f"<|im_start|>{m['role']}\n{m.get('content', '')}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
        if not enable_thinking:
            parts.append("<think>\n\n</think>\n\n")
    return "".join(parts)

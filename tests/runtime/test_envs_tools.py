"""Tools as text (`locojax.envs.tools`), Qwen3's chat template with tools and tool messages
(`locojax.tokenizers.chat`, its Jinja twin rendered as transformers renders it) and the plain
turn format (`locojax.envs.turns`)."""

from __future__ import annotations

import datetime
import json
from typing import Literal, Optional

import jinja2.sandbox
import pytest

from locojax.envs.tools import (
    ToolCall,
    ToolSpecError,
    parse_tool_calls,
    tool_result_text,
    tool_schema,
)
from locojax.envs.turns import render_plain
from locojax.tokenizers import apply_chat_template
from locojax.tokenizers.chat import CHAT_TEMPLATE_JINJA
from locojax.tokenizers.jinja_chat import render_jinja

# --- tool_schema -----------------------------------------------------------------------------


def search(
    query: str,
    limit: int,
    scale: float = 1.0,
    exact: bool = False,
    ids: list[int] | None = None,
    order: Literal["asc", "desc"] = "asc",
    extra: dict | None = None,
    note: Optional[str] = None,  # noqa: UP045 (the typing spelling is supported too)
) -> list[str]:
    """Search the index for documents
    that match a query.

    Args:
        query: The words to look for.
        limit (int): At most this many
            results.
        scale: A weight.
        exact: Match the words exactly.
        ids: Only these documents.
        order: The sort order.
        extra: Filters.
        note: A remark.

    Returns:
        The matching titles.
    """
    return []


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def now() -> str:
    """The time."""
    return "noon"


def test_a_schema_carries_types_descriptions_enums_and_what_is_required():
    assert tool_schema(search) == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the index for documents that match a query.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "The words to look for."},
                    "limit": {"type": "integer", "description": "At most this many results."},
                    "scale": {"type": "number", "description": "A weight."},
                    "exact": {"type": "boolean", "description": "Match the words exactly."},
                    "ids": {
                        "type": "array",
                        "items": {"type": "integer"},
                        "description": "Only these documents.",
                    },
                    "order": {
                        "type": "string",
                        "enum": ["asc", "desc"],
                        "description": "The sort order.",
                    },
                    "extra": {"type": "object", "description": "Filters."},
                    "note": {"type": "string", "description": "A remark."},
                },
                "required": ["query", "limit"],
            },
        },
    }


def test_a_schema_without_parameters_and_with_bare_and_mixed_types():
    assert tool_schema(now)["function"] == {
        "name": "now",
        "description": "The time.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    }

    def mixed(xs: list, level: Literal[1, "high"], flag: Literal[True], maybe: int | None) -> None:
        """Mixed.

        Args:
            xs: Anything.
            level: A level.
            flag: Always on.
            maybe: Left out or a number (not required, though it has no default).
        """

    parameters = tool_schema(mixed)["function"]["parameters"]
    assert parameters["required"] == ["xs", "level", "flag"]
    props = parameters["properties"]
    assert props["maybe"]["type"] == "integer"
    assert props["xs"] == {"type": "array", "description": "Anything."}
    assert props["level"] == {"enum": [1, "high"], "description": "A level."}
    assert props["flag"] == {"type": "boolean", "enum": [True], "description": "Always on."}


def _no_hint(a, b: int) -> int:
    """Add.

    Args:
        a: The first.
        b: The second.
    """


def _no_docstring(a: int) -> int:
    return a


def _undescribed(a: int, b: int) -> int:
    """Add.

    Args:
        a: The first.
    """


def _no_args_section(a: int) -> int:
    """Add."""


def _unsupported(a: int | str) -> int:
    """Add.

    Args:
        a: A number or a word.
    """


def _varargs(*numbers: int) -> int:
    """Add.

    Args:
        numbers: The numbers.
    """


@pytest.mark.parametrize(
    "fn, why",
    [
        (_no_hint, "parameter 'a' has no type hint"),
        (_no_docstring, "no docstring"),
        (_undescribed, "parameter 'b' has no description under Args:"),
        (_no_args_section, "parameter 'a' has no description under Args:"),
        (_unsupported, "parameter 'a' has type int | str: not int, float"),
        (_varargs, "parameter 'numbers' is variadic positional"),
    ],
)
def test_a_function_that_cannot_be_a_tool_is_named_in_one_line(fn, why):
    with pytest.raises(ToolSpecError) as caught:
        tool_schema(fn)
    message = str(caught.value)
    assert message.startswith(f"tool {fn.__name__}: ") and why in message, message
    assert "\n" not in message
    assert isinstance(caught.value, ValueError)


# --- parse_tool_calls ------------------------------------------------------------------------


def _block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_a_reply_without_calls_has_none():
    assert parse_tool_calls("The answer is 5.") == ([], 0)
    assert parse_tool_calls("") == ([], 0)
    assert parse_tool_calls("a stray </tool_call> is ignored") == ([], 0)


def test_one_call_and_several_calls_in_order():
    one = "<think>\nadd\n</think>\n\n" + _block('{"name": "add", "arguments": {"a": 1, "b": 2}}')
    assert parse_tool_calls(one) == ([ToolCall("add", {"a": 1, "b": 2})], 0)
    several = (
        "first <tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call> then\n"
        + _block('  {"name": "add", "arguments": {"a": 3, "b": 4}}  ')
        + "\n"
        + _block('{"name": "search", "arguments": {"query": "é", "ids": [1, 2]}}')
    )
    assert parse_tool_calls(several) == (
        [
            ToolCall("now", {}),
            ToolCall("add", {"a": 3, "b": 4}),
            ToolCall("search", {"query": "é", "ids": [1, 2]}),
        ],
        0,
    )


def test_arguments_given_as_a_json_string_are_decoded():
    reply = _block(json.dumps({"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}))
    assert parse_tool_calls(reply) == ([ToolCall("add", {"a": 1, "b": 2})], 0)


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "add", "arguments": {"a": 1}',  # bad JSON
        "add(1, 2)",  # not JSON at all
        '["add", {"a": 1}]',  # JSON, not an object
        '{"arguments": {"a": 1}}',  # no name
        '{"name": "", "arguments": {}}',  # an empty name
        '{"name": 7, "arguments": {}}',  # a name that is no string
        '{"name": "add"}',  # no arguments
        '{"name": "add", "arguments": [1, 2]}',  # arguments not an object
        '{"name": "add", "arguments": "[1, 2]"}',  # a string holding no object
        '{"name": "add", "arguments": "{\\"a\\": "}',  # a string holding bad JSON
    ],
)
def test_each_malformed_block_is_counted_and_the_good_ones_kept(body):
    good = _block('{"name": "now", "arguments": {}}')
    assert parse_tool_calls(good + _block(body) + good) == ([ToolCall("now", {})] * 2, 1)


def test_an_unclosed_block_is_malformed_and_ends_the_scan():
    good = _block('{"name": "now", "arguments": {}}')
    assert parse_tool_calls(good + '<tool_call>\n{"name": "add", "arguments": {}}') == (
        [ToolCall("now", {})],
        1,
    )
    assert parse_tool_calls("<tool_call>" + good) == ([], 1)  # the inner open is in the JSON


def test_a_tool_result_becomes_text():
    assert tool_result_text("5 apples") == "5 apples"
    assert tool_result_text(5) == "5"
    assert tool_result_text({"a": [1, None], "b": "é"}) == '{"a": [1, null], "b": "é"}'
    assert tool_result_text(None) == "null"
    with pytest.raises(TypeError, match="returned a dict that is neither a str nor a JSON"):
        tool_result_text({"when": datetime.date(2024, 1, 2)})  # issue 62: the model reads why


# --- the chat template with tools --------------------------------------------------------------

TOOLS = [tool_schema(add), tool_schema(now)]
TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(TOOLS[0])
    + "\n"
    + json.dumps(TOOLS[1])
    + "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
USER = {"role": "user", "content": "What is 2+3?"}
CALL = {"role": "assistant", "content": _block('{"name": "add", "arguments": {"a": 2, "b": 3}}')}


def test_tools_open_the_text_after_the_system_message():
    system = {"role": "system", "content": "Be brief."}
    assert apply_chat_template([system, USER], tools=TOOLS) == (
        "<|im_start|>system\nBe brief.\n\n" + TOOLS_BLOCK
        + "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert apply_chat_template([USER], tools=TOOLS, enable_thinking=False) == (
        "<|im_start|>system\n" + TOOLS_BLOCK
        + "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # No tools (None or empty) leaves the text as before.
    assert apply_chat_template([system, USER], tools=[]) == apply_chat_template([system, USER])
    assert apply_chat_template([system, USER]).startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_consecutive_tool_messages_share_one_user_turn():
    five, six = {"role": "tool", "content": "5"}, {"role": "tool", "content": '{"v": 6}'}
    got = apply_chat_template([USER, CALL, five, six, CALL, five], tools=TOOLS)
    assert got == (
        "<|im_start|>system\n" + TOOLS_BLOCK
        + "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        + "<|im_start|>assistant\n" + CALL["content"] + "<|im_end|>\n"
        + "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
        + '<tool_response>\n{"v": 6}\n</tool_response><|im_end|>\n'
        + "<|im_start|>assistant\n" + CALL["content"] + "<|im_end|>\n"
        + "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        + "<|im_start|>assistant\n"
    )
    # A turn's environment messages alone (what follows a reply in a multi-turn episode).
    assert apply_chat_template([five, six], enable_thinking=False) == (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
        '<tool_response>\n{"v": 6}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_reasoning_after_tool_responses_is_kept_since_they_are_no_query():
    thought = {"role": "assistant", "content": "<think>\nsum\n</think>\n\n" + CALL["content"]}
    got = apply_chat_template([USER, thought, {"role": "tool", "content": "5"}, thought])
    assert got.count("<think>\nsum\n</think>\n\n<tool_call>") == 2
    later = apply_chat_template([USER, thought, {"role": "tool", "content": "5"}, USER])
    assert "<think>" not in later


def test_an_openai_tool_calls_field_is_rendered_after_the_content():
    message = {
        "role": "assistant",
        "content": "Let me add.",
        "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
            {"name": "now", "arguments": "{}"},
        ],
    }
    got = apply_chat_template([USER, message], add_generation_prompt=False)
    assert got.endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\nLet me add.\n"
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call><|im_end|>\n'
    )


def test_an_unknown_role_is_refused():
    with pytest.raises(ValueError, match="role 'robot'"):
        apply_chat_template([USER, {"role": "robot", "content": "x"}])


def _hf_template() -> jinja2.Template:
    """CHAT_TEMPLATE_JINJA as transformers compiles it: a sandbox, trim and lstrip blocks, and
    its `tojson` (json.dumps, non-ASCII kept, keys in order)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    return env.from_string(CHAT_TEMPLATE_JINJA)


EXOTIC = {"type": "function", "function": {"name": "café", "description": "<b> & 'q'",
                                           "parameters": {"type": "object", "properties": {}}}}
CONVERSATIONS = [
    [USER],
    [{"role": "system", "content": "Be brief."}, USER, CALL, {"role": "tool", "content": "5"}],
    [USER, CALL, {"role": "tool", "content": "5"}, {"role": "tool", "content": "é"},
     {"role": "assistant", "content": "<think>x</think>The sum is 5."}],
    [{"role": "tool", "content": "5"}, USER, {"role": "tool", "content": "6"}],
    [USER, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "add", "arguments": {"a": "é"}}}]},
     {"role": "system", "content": "later"}],
    # Reasoning before the last query is dropped; after it, kept (an empty block when none).
    [{"role": "system", "content": "Be brief."}, USER,
     {"role": "assistant", "content": "<think>\nadd them\n</think>\n\nIt is 5."},
     {"role": "user", "content": "And 3+4?"}],
    [USER, {"role": "assistant", "content": "7", "reasoning_content": "\nadd\n"}],
    [{"role": "system", "content": "Be brief."}, USER, {"role": "assistant", "content": "5"}],
]


@pytest.mark.parametrize("tools", [None, TOOLS, [EXOTIC]])
@pytest.mark.parametrize("generation_prompt, thinking", [(True, True), (True, False),
                                                       (False, True)])
def test_the_jinja_template_renders_tools_as_the_python_one(tools, generation_prompt, thinking):
    template = _hf_template()
    for messages in CONVERSATIONS:
        got = template.render(messages=messages, tools=tools,
                              add_generation_prompt=generation_prompt, enable_thinking=thinking)
        want = apply_chat_template(messages, add_generation_prompt=generation_prompt,
                                   enable_thinking=thinking, tools=tools)
        assert got == want, messages
        # The same through LoCoJAX's own Jinja renderer (a checkpoint's template).
        assert render_jinja(CHAT_TEMPLATE_JINJA, messages, tools=tools, enable_thinking=thinking,
                            add_generation_prompt=generation_prompt) == want, messages
        assert ("# Tools" in want) == bool(tools)
    exotic = apply_chat_template([USER], tools=[EXOTIC])
    assert '"name": "café", "description": "<b> & \'q\'"' in exotic


# --- the plain turn format ---------------------------------------------------------------------


def test_plain_turns_list_tools_then_messages_then_the_generation_prompt():
    messages = [{"role": "system", "content": "Be brief."}, USER, CALL,
                {"role": "tool", "content": "5"}]
    assert render_plain(messages, TOOLS) == (
        "System: Tools: add(a, b)\n"
        "System: Tools: now()\n"
        "System: Be brief.\n"
        "User: What is 2+3?\n"
        f"Assistant: {CALL['content']}\n"
        "Tool: 5\n"
        "Assistant: "
    )
    assert render_plain([USER]) == "User: What is 2+3?\nAssistant: "
    assert render_plain([{"role": "tool", "content": "6"}], []) == "Tool: 6\nAssistant: "
    with pytest.raises(ValueError, match="role 'robot'"):
        render_plain([{"role": "robot", "content": "x"}])


def test_plain_turns_use_a_small_alphabet_besides_the_contents():
    messages = [{"role": r, "content": ""} for r in ("system", "user", "assistant", "tool")]
    text = render_plain(messages, [tool_schema(search)])
    letters = "abcdefghijklmnopqrstuvwxyz"
    assert set(text) <= set(letters + letters.upper() + "0123456789:(), \n"), set(text)

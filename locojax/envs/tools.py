"""Tools as text: a Python function's schema, the model's calls in its reply, a result's text.

    def add(a: int, b: int = 0) -> int     ──tool_schema──> {"type": "function", "function":
        '''Add two numbers.                     {"name": "add", "description": "Add two numbers.",
                                                 "parameters": {"type": "object", "properties":
        Args:                                     {"a": {"type": "integer", "description": ...},
            a: The first.                          "b": {...}}, "required": ["a"]}}}
            b: The second.'''                   (the OpenAI / Qwen3 form; the chat template
                                                 lists it in the system turn)
    reply ──parse_tool_calls──> ([ToolCall("add", {"a": 1})], malformed blocks)
        from Qwen3's `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks
    fn(**call.arguments) ──tool_result_text──> the tool message's content

A function is a tool when it has a Google-style docstring (the first paragraph describes it;
`Args:` describes every parameter) and a type hint on every parameter, each one of `int`,
`float`, `str`, `bool`, `list[...]`, `dict`, `Literal[...]` (an enum) or `X | None`. Anything
else raises `ToolSpecError` with one line naming the function.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Union

_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean"}
_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:$")
"""A Google-style section header (`Args:`, `Returns:`, ...), unindented."""
_ARG = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:(.*)$")
"""One `Args:` entry: `name: text` or `name (type): text`."""
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


class ToolSpecError(ValueError):
    """A function that cannot be a tool; the message is one line naming it and what is missing."""


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call from a reply: the tool's name and its keyword arguments."""

    name: str
    arguments: dict


def _description(doc: str) -> str:
    """The docstring's first paragraph, its lines joined by spaces."""
    lines = []
    for line in doc.splitlines():
        if not line.strip() or _SECTION.match(line):
            break
        lines.append(line.strip())
    return " ".join(lines)


def _arg_docs(doc: str) -> dict[str, str]:
    """{parameter: description} from the `Args:` section; continuation lines are joined."""
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if line in ("Args:", "Arguments:")), None)
    if start is None:
        return {}
    docs: dict[str, str] = {}
    name, indent = None, None
    for line in lines[start + 1 :]:
        if line.strip() and not line[0].isspace():
            break  # the next section
        depth = len(line) - len(line.lstrip())
        entry = _ARG.match(line.strip())
        if entry and (indent is None or depth <= indent):
            name, indent = entry[1], depth
            docs[name] = entry[2].strip()
        elif name and line.strip():
            docs[name] = f"{docs[name]} {line.strip()}".strip()
    return docs


def _optional(hint: Any) -> tuple[Any, bool]:
    """(X, True) for `X | None` and `Optional[X]`; (hint, False) otherwise."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(rest) == 1 and len(rest) < len(typing.get_args(hint)):
            return rest[0], True
    return hint, False


def _type_schema(hint: Any) -> dict | None:
    """The JSON schema of a supported type hint; None when it is not supported."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if hint is list or origin is list:
        if not args:
            return {"type": "array"}
        items = _type_schema(args[0])
        return None if items is None else {"type": "array", "items": items}
    if hint is dict or origin is dict:
        return {"type": "object"}
    if origin is Literal:
        kinds = {_SCALARS.get(type(a)) for a in args}
        if None in kinds:
            return None
        return {**({"type": kinds.pop()} if len(kinds) == 1 else {}), "enum": list(args)}
    return None


def _parameter(fn_name: str, p: inspect.Parameter, hint: Any, doc: str | None) -> dict:
    """The schema of one parameter (its type and description); ToolSpecError when it has none."""
    where = f"tool {fn_name}: parameter {p.name!r}"
    if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
        raise ToolSpecError(f"{where} is {p.kind.description}; a tool takes keyword arguments")
    if hint is None:
        raise ToolSpecError(f"{where} has no type hint")
    if not doc:
        raise ToolSpecError(f"{where} has no description under Args: in the docstring")
    schema = _type_schema(_optional(hint)[0])
    if schema is None:
        raise ToolSpecError(
            f"{where} has type {hint!r}: not int, float, str, bool, list[...], dict, "
            "Literal[...] or X | None"
        )
    return {**schema, "description": doc}


def tool_schema(fn: Callable) -> dict:
    """`fn` as a tool in the OpenAI / Qwen3 form (see the module docstring).

    A parameter is required unless it has a default or is typed `X | None`. Raises
    ToolSpecError when `fn` has no docstring or no description, or a parameter has no type
    hint, no description under `Args:`, a type outside the supported ones, or is `*args`,
    `**kwargs` or positional-only (a tool is called as `fn(**arguments)`).
    """
    name = getattr(fn, "__name__", repr(fn))
    doc = inspect.getdoc(fn)
    if not doc:
        raise ToolSpecError(f"tool {name}: no docstring (it describes the tool and each parameter)")
    description = _description(doc)
    if not description:
        raise ToolSpecError(f"tool {name}: the docstring has no description before its sections")
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError) as e:
        raise ToolSpecError(f"tool {name}: its type hints do not resolve ({e})") from None
    arg_docs = _arg_docs(doc)
    properties, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        properties[p.name] = _parameter(name, p, hints.get(p.name), arg_docs.get(p.name))
        if p.default is p.empty and not _optional(hints[p.name])[1]:
            required.append(p.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def _call(body: str) -> ToolCall | None:
    """The call in one block's text; None when it is malformed."""
    try:
        obj = json.loads(body)
        if not isinstance(obj, dict):
            return None
        arguments = obj.get("arguments")
        if isinstance(arguments, str):  # some models encode the object as a string
            arguments = json.loads(arguments)
    except (ValueError, RecursionError):
        return None
    name = obj.get("name")
    if not (isinstance(name, str) and name and isinstance(arguments, dict)):
        return None
    return ToolCall(name=name, arguments=arguments)


def parse_tool_calls(reply: str) -> tuple[list[ToolCall], int]:
    """(the well-formed calls in `reply`, in order; the number of malformed blocks).

    A block is `<tool_call>` JSON `</tool_call>`, whitespace around the JSON optional. The
    JSON must be an object with a non-empty string `name` and an object `arguments` (or a
    string holding one). Malformed: JSON that does not parse, a missing or empty name,
    arguments missing or not an object, and an unclosed `<tool_call>` (which ends the scan).
    A stray `</tool_call>` is ignored.
    """
    calls, malformed, at = [], 0, 0
    while (start := reply.find(_OPEN, at)) >= 0:
        end = reply.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            return calls, malformed + 1
        call = _call(reply[start + len(_OPEN) : end])
        if call is None:
            malformed += 1
        else:
            calls.append(call)
        at = end + len(_CLOSE)
    return calls, malformed


def tool_result_text(value: Any) -> str:
    """A tool's return value as the tool message's content: a str as it is; a JSON value
    (None, bool, number, list, dict) as JSON, non-ASCII kept as is. TypeError, which the
    model reads as the tool's error, for anything else (a set, a date, bytes, an object, nan,
    a dict with keys that are no str)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        raise TypeError(f"the tool returned a {type(value).__name__} that is neither a str nor "
                        "a JSON value (None, bool, finite number, list, dict with str "
                        "keys)") from None

"""A checkpoint's chat template is code from outside: refused before it renders when it reaches
for Python's internals, and bounded in time and size whenever it renders.

    template text ──unsafe_reach (its syntax tree, nothing run)──> None | "line 3: __globals__"
        any attribute or subscript by a name with a leading underscore (`__class__`,
        `__init__.__globals__`, `__mro__`), or one of Python's frame, code and module handles
        (`f_globals`, `gi_frame`, `os`, `sys`, ...), also through `attr()` and the filters'
        `attribute=`: the sandbox would refuse them while rendering; here a template holding
        one is refused when it is loaded, before any step
    GuardedEnvironment.render ──> text, or RenderBound (a ValueError) once the render has run
        `MAX_STEPS` template lines, range items and calls, or `RENDER_S` seconds, or has
        made a text, list or output of more than `MAX_TEXT` characters or items

The sizes are checked where a template can make them: the sandbox's binary operators (`*`,
`**`, `%`, `+`), every call (macros, `loop()`, methods such as `str.format`: their
arguments and results), every filter (its arguments and result), `namespace` attributes (the
only state a loop can grow), `range`, and the output as it streams. `lipsum` is not offered.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import (
    UNSAFE_ASYNC_GENERATOR_ATTRIBUTES,
    UNSAFE_COROUTINE_ATTRIBUTES,
    UNSAFE_FUNCTION_ATTRIBUTES,
    UNSAFE_GENERATOR_ATTRIBUTES,
    UNSAFE_METHOD_ATTRIBUTES,
    ImmutableSandboxedEnvironment,
)
from jinja2.utils import Namespace

MAX_TEXT = 1 << 20
"""Characters of a render's output, and characters or items of any value it makes."""
MAX_STEPS = 2_000_000
"""Template lines run, range items made and calls made by one render."""
RENDER_S = 5.0
"""Seconds one render may take."""
INTERNAL = frozenset({
    *UNSAFE_FUNCTION_ATTRIBUTES, *UNSAFE_METHOD_ATTRIBUTES, *UNSAFE_GENERATOR_ATTRIBUTES,
    *UNSAFE_COROUTINE_ATTRIBUTES, *UNSAFE_ASYNC_GENERATOR_ATTRIBUTES, "mro", "f_globals",
    "f_locals", "f_builtins", "f_code", "f_back", "tb_frame", "tb_next", "os", "sys",
    "subprocess", "builtins", "importlib", "posix", "modules", "globals", "func_globals"})
"""Attribute names of Python's functions, frames, generators and modules, and of the modules
that run commands: a chat template has no use for any of them."""
_NAMED = ("attr",)
"""Filters whose first argument is an attribute name."""
_HUGE_WIDTH = re.compile(r"\d{7,}")
"""A format width or precision of a million or more (`%09999999d`, `{:>9999999}`)."""


class RenderBound(ValueError):
    """A render ran past one of the bounds (its text says which)."""


_state = threading.local()


def _tick(n: int = 1) -> None:
    """Count `n` steps of the render in progress; RenderBound past MAX_STEPS or RENDER_S."""
    steps = getattr(_state, "steps", None)
    if steps is None:
        return
    _state.steps = steps + n
    if _state.steps > MAX_STEPS:
        raise RenderBound(f"the template ran more than {MAX_STEPS} steps (lines, range items, "
                          "calls) in one render")
    if steps // 4096 != _state.steps // 4096 and time.monotonic() > _state.deadline:
        raise RenderBound(f"the template rendered for more than {RENDER_S:g} s")


def _sized(value: Any) -> Any:
    """`value`, or RenderBound when it is a text or a collection past MAX_TEXT."""
    if isinstance(value, str | bytes | list | tuple | dict | set) and len(value) > MAX_TEXT:
        raise RenderBound(f"the template made a value of {len(value)} characters or items "
                          f"(more than {MAX_TEXT})")
    return value


def _no_huge_width(text: Any) -> None:
    if isinstance(text, str) and _HUGE_WIDTH.search(text) and ("%" in text or "{" in text):
        raise RenderBound("the template formats with a width of a million or more")


def _arguments(args: tuple, kwargs: dict) -> None:
    """RenderBound for an argument that is too big (a text, a collection, a number past
    MAX_TEXT: a width, a count, a repeat)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_TEXT:
            raise RenderBound(f"the template passed the number {value} (more than {MAX_TEXT})")
        _sized(value)
        _no_huge_width(value)


def _bounded_filter(fn: Callable) -> Callable:
    """`fn` (a filter) with its arguments and result checked, its call counted."""
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        _arguments(args, kwargs)
        return _sized(fn(*args, **kwargs))
    for attr in ("jinja_pass_arg",):  # how Jinja passes the context or environment first
        if hasattr(fn, attr):
            setattr(bounded, attr, getattr(fn, attr))
    return bounded


def _range(*args: int) -> range:
    """`range` of at most MAX_TEXT items, each counted as a step."""
    made = range(*args)
    if len(made) > MAX_TEXT:
        raise RenderBound(f"the template asked for a range of {len(made)} items")
    _tick(len(made))
    return made


class _Filters(dict):
    """The environment's filters, each one bounded (`_bounded_filter`) as it is set."""

    def __setitem__(self, name: str, fn: Callable) -> None:
        super().__setitem__(name, _bounded_filter(fn))


class _Namespace(Namespace):
    """`namespace()`, its attributes' values size-checked (a loop grows state only here)."""

    def __setitem__(self, name: str, value: Any) -> None:
        _tick()
        super().__setitem__(name, _sized(value))


class GuardedEnvironment(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox with every render bounded (module docstring)."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals.pop("lipsum", None)
        self.globals["range"] = _range
        self.globals["namespace"] = _Namespace
        bounded = _Filters()
        for name, fn in self.filters.items():
            bounded[name] = fn
        self.filters = bounded

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """`left <operator> right`, refused when it would make a value past MAX_TEXT."""
        _tick()
        if operator == "**" and isinstance(right, int) and abs(right) > 64:
            raise RenderBound(f"the template raised a number to the power {right}")
        if operator == "*":
            seq, times = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, str | list | tuple) and isinstance(times, int) \
                    and len(seq) * times > MAX_TEXT:
                raise RenderBound(f"the template repeated a value {times} times")
        if operator == "%":
            _no_huge_width(left)
        return _sized(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        """A call from the template (a macro, `loop()`, a method), counted and checked."""
        _tick()
        _arguments(args, kwargs)
        _no_huge_width(getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None))
        return _sized(super().call(__context, __obj, *args, **kwargs))

    def render_bounded(self, template: Any, **variables: Any) -> str:
        """`template` rendered with `variables` inside the bounds; RenderBound past one."""
        previous = sys.gettrace()
        _state.steps, _state.deadline = 0, time.monotonic() + RENDER_S
        sys.settrace(_trace_calls)
        try:
            return _joined(template.generate(**variables))
        finally:
            sys.settrace(previous)
            _state.steps = None


def _joined(chunks: Iterator[str]) -> str:
    """The output, refused once it passes MAX_TEXT characters."""
    out, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > MAX_TEXT:
            raise RenderBound(f"the template wrote more than {MAX_TEXT} characters")
        out.append(chunk)
    return "".join(out)


def _trace_calls(frame: Any, event: str, arg: Any) -> Callable | None:
    """The render's tracer: line events in the template's own code only."""
    return _trace_lines if frame.f_code.co_filename == "<template>" else None


def _trace_lines(frame: Any, event: str, arg: Any) -> Callable | None:
    if event == "line":
        _tick()
    return _trace_lines


PROBE = ({"role": "user", "content": "Hello."},)
"""The conversation a template renders once when it is loaded (`check_template`)."""


def check_template(env: GuardedEnvironment, source: str, compiled: Any) -> None:
    """ValueError (one line) when template `source` reaches for Python's internals
    (`unsafe_reach`, nothing rendered), or when `compiled` rendering `PROBE` runs past a
    bound or breaks the sandbox: before any step, rather than in one."""
    reach = unsafe_reach(env, source)
    if reach is not None:
        raise ValueError(f"chat template reaches for Python's internals ({reach}); refused "
                         "before it renders")
    try:
        env.render_bounded(compiled, messages=list(PROBE), add_generation_prompt=True,
                           enable_thinking=False, tools=None)
    except (RenderBound, RecursionError, MemoryError) as err:
        out_of = "recursion depth" if isinstance(err, RecursionError) else "memory"
        why = err if isinstance(err, RenderBound) else f"the template ran out of {out_of}"
        raise ValueError(f"chat template: {why}") from None
    except SecurityError as err:
        raise ValueError(f"chat template: {str(err).splitlines()[0]}") from None
    except Exception:  # noqa: BLE001 - it may refuse a lone user message: its own rule
        return


def unsafe_reach(env: ImmutableSandboxedEnvironment, source: str) -> str | None:
    """Where template `source` reaches for Python's internals ("line 3: `__globals__`"), or
    None; found in its syntax tree, nothing rendered (a template that does not parse: None,
    its compile error is told elsewhere)."""
    try:
        tree = env.parse(source)
    except Exception:  # noqa: BLE001 - a syntax error is the compiler's to name
        return None
    for node in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Filter)):
        name = _reached(node)
        if name is not None and (name.startswith("_") or name in INTERNAL):
            return f"line {node.lineno}: `{name}`"
    return None


def _reached(node: nodes.Node) -> str | None:
    """The attribute name a node reads, when it is written in the template."""
    if isinstance(node, nodes.Getattr):
        return node.attr
    if isinstance(node, nodes.Getitem):
        return node.arg.value if isinstance(node.arg, nodes.Const) and isinstance(
            node.arg.value, str) else None
    names = [a.value for a in node.args[:1] if node.name in _NAMED
             and isinstance(a, nodes.Const)]
    names += [k.value.value for k in node.kwargs if k.key == "attribute"
              and isinstance(k.value, nodes.Const)]
    return next((n for n in names if isinstance(n, str) and (n.startswith("_")
                                                            or n in INTERNAL)), None)

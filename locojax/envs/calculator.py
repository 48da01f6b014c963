"""Built-in tools: `calculate` (`+experiment=gsm8k_tools_co`) and `add` (`arith_tools_co`).

    model's call {"name": "calculate", "arguments": {"expression": "(48 / 2) * 3"}}
        -> ast.parse(expression, mode="eval") -> only numbers, + - * / // % ** and parentheses
        -> the value as text ("72", "0.5") -> the tool message the model reads

The expression is parsed, never `eval`-ed: a name, a call, an attribute or any other node is
refused, and so are powers and numbers whose size could exhaust the worker (a tool runs in the
environment worker of the host that sampled, under `workload.tool_timeout_s`). A refused or
failing expression raises `ValueError`; the environment runner returns its message to the model
as the tool's result and counts it in `tool_errors`.
"""

from __future__ import annotations

import ast
import math
import operator

MAX_EXPRESSION_CHARS = 200
"""Longer expressions are refused (a reply's arithmetic, not a program)."""
MAX_ABS = 1e15
"""Operands and results beyond this magnitude are refused."""
MAX_EXPONENT = 64
"""Powers with larger exponents are refused."""

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _bounded(x: int | float) -> int | float:
    if not math.isfinite(x) or abs(x) > MAX_ABS:
        raise ValueError(f"{x} is out of range (|x| <= {MAX_ABS:g})")
    return x


def _value(node: ast.AST) -> int | float:
    """The value of an arithmetic node; ValueError for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
    raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not "
                     f"{ast.unparse(node)!r}")


def _text(x: int | float) -> str:
    """An integral value without a trailing `.0`; others to 10 significant digits."""
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x) if isinstance(x, int) else f"{x:.10g}"


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The expression, with numbers, + - * / // % ** and parentheses, for
            example "(48 / 2) * 3".
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"{expression!r} is not an arithmetic expression") from None
    return _text(_value(tree.body))


def add(a: int, b: int) -> int:
    """Add two integers and return their sum.

    Args:
        a: The first integer.
        b: The second integer.
    """
    for x in (a, b):
        if isinstance(x, bool) or not isinstance(x, int):
            raise ValueError(f"{x!r} is not an integer")
        _bounded(x)
    return a + b

"""No function in `locojax/`, `compiler/`, `benchmarks/` or `scripts/` is longer than 60 lines (a long loop body
becomes named steps). Nested functions and closures count toward their outermost parent."""

import ast
from pathlib import Path

from paths import ROOT

MAX_LINES = 60


def function_sizes(paths: list[Path]) -> list[tuple[int, str]]:
    """(lines, 'file:line name') of every outermost function or method, longest first."""
    out = []
    for path in paths:
        tree = ast.parse(path.read_text())
        for node in _outermost_functions(tree):
            lines = node.end_lineno - node.lineno + 1
            out.append((lines, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"))
    return sorted(out, reverse=True)


def _outermost_functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Functions not nested in another function (methods of top-level classes included)."""
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append(child)
            else:
                stack.append(child)
    return found


def test_no_function_is_longer_than_60_lines():
    paths = sorted(p for top in ("locojax", "compiler", "benchmarks", "scripts")
                   for p in ROOT.joinpath(top).rglob("*.py"))
    long = [f"{name}: {n} lines" for n, name in function_sizes(paths) if n > MAX_LINES]
    assert not long, "split into named steps:\n" + "\n".join(long)


def test_a_closure_counts_toward_its_parent(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(90))
    (tmp_path / "m.py").write_text(f"def outer():\n    def inner():\n{body}\n    return inner\n"
                                   "class A:\n    def f(self):\n        return 1\n")
    tree = ast.parse((tmp_path / "m.py").read_text())
    sizes = {f.name: f.end_lineno - f.lineno + 1 for f in _outermost_functions(tree)}
    assert sizes == {"outer": 93, "f": 2}

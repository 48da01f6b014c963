"""The two import rules of the house, checked on the source (ast), not by importing it.

1. `compiler/` never imports locojax, jax, flax, hydra or omegaconf at module level.
2. Pure-JAX runtime code (locojax/model, rollout, rewards, train, data) never imports hydra,
   omegaconf or the compiler, except the axis vocabulary and parameter table
   (`compiler.axes`, `compiler.params`), at any level.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPILER_BANNED = {"locojax", "jax", "jaxlib", "flax", "hydra", "omegaconf"}
RUNTIME_DIRS = ("model", "rollout", "rewards", "train", "data")
RUNTIME_BANNED = {"hydra", "omegaconf"}
RUNTIME_ALLOWED_COMPILER = {"compiler.axes", "compiler.params"}


def _imports(tree: ast.AST, module_level_only: bool) -> list[tuple[int, str]]:
    """(line, dotted name) of each import; `from a import b` yields `a.b`."""
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    if module_level_only:  # module level includes `if`/`try` blocks, not function bodies
        nodes = [n for top in tree.body for n in ast.walk(top)
                 if not isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return out


def _files(*parts: str) -> list[Path]:
    return sorted(ROOT.joinpath(*parts).rglob("*.py"))


@pytest.mark.parametrize("path", _files("compiler"), ids=lambda p: str(p.relative_to(ROOT)))
def test_compiler_imports_no_runtime_at_module_level(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [(line, name) for line, name in _imports(tree, module_level_only=True)
           if name.split(".")[0] in COMPILER_BANNED]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def _runtime_files() -> list[Path]:
    return [p for d in RUNTIME_DIRS for p in _files("locojax", d)]


def _runtime_violation(name: str) -> bool:
    top = name.split(".")[0]
    if top in RUNTIME_BANNED:
        return True
    if top != "compiler":
        return False
    # a bare `import compiler` (or `from compiler import compile`) pulls in the whole compiler
    return not any(name == ok or name.startswith(ok + ".") for ok in RUNTIME_ALLOWED_COMPILER)


@pytest.mark.parametrize("path", _runtime_files() or [None],
                         ids=lambda p: str(p.relative_to(ROOT)) if p else "none")
def test_runtime_code_imports_no_hydra_or_compiler_schema(path):
    if path is None:
        pytest.skip("no runtime files yet")
    tree = ast.parse(path.read_text(), filename=str(path))
    names = _imports(tree, module_level_only=False)
    bad = [(line, name) for line, name in names if _runtime_violation(name)]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_checker_catches_violations():
    tree = ast.parse("import jax\ndef f():\n    import hydra\nfrom compiler import config\n")
    assert [n for _, n in _imports(tree, True)] == ["jax", "compiler.config"]
    assert "hydra" in [n for _, n in _imports(tree, False)]
    assert _runtime_violation("compiler.config.Config")
    assert _runtime_violation("compiler.plan") and _runtime_violation("compiler")
    assert not _runtime_violation("compiler.axes.LogicalAxis")
    assert _runtime_violation("omegaconf")

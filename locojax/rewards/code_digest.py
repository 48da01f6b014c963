"""The digest of a user's code file and of the local modules it imports (the run's record).

    file.py ──ast (parsed, never run)──> import / from-import names, transitively
        ──> the files they name under the file's own directory (<name>.py, <name>/__init__.py)
        ──> sha256(file bytes, then each local module's relative path and bytes, in path order)

A file that imports no local module keeps the plain sha256 of its bytes (the record of a run
made before local modules were counted still matches). Modules found elsewhere (installed
packages, the standard library) are not local: their versions are the environment's.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path


def _candidates(base: Path, dotted: str) -> list[Path]:
    """The files `dotted` (and each of its parent packages) could be under `base`."""
    parts = [p for p in dotted.split(".") if p]
    out = []
    for n in range(1, len(parts) + 1):
        stem = base.joinpath(*parts[:n])
        out += [stem.with_suffix(".py"), stem / "__init__.py"]
    return out


def _imported(path: Path, root: Path) -> list[Path]:
    """The candidate files of every module `path`'s source imports (a file that does not
    parse imports nothing here: loading it is what reports it)."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found += _candidates(root, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = root if node.level == 0 else path.parents[node.level - 1]
            module = node.module or ""
            found += _candidates(base, module)
            found += [f for a in node.names for f in _candidates(base, f"{module}.{a.name}")]
    return found


def local_modules(path: Path) -> list[Path]:
    """The files under `path`'s directory that `path` imports, directly or through each other,
    sorted by path (`path` itself excluded)."""
    path = path.resolve()
    root = path.parent
    seen, todo = {path}, [path]
    while todo:
        for f in _imported(todo.pop(), root):
            f = f.resolve()
            if f not in seen and f.is_file() and f.is_relative_to(root):
                seen.add(f)
                todo.append(f)
    return sorted(seen - {path})


def code_digest(path: Path) -> str:
    """sha256 of `path` and of its local modules (see the module docstring)."""
    digest = hashlib.sha256(path.read_bytes())
    root = path.resolve().parent
    for f in local_modules(path):
        digest.update(b"\0" + str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()

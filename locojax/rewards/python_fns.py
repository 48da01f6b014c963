"""Reward functions named by spec (`<file.py>:<function>` or `<module>:<function>`): loading
one, the digest of its file (the run's record), and the one-line error of a broken one.

A function `fn(prompts=[...], completions=[...], **columns)` returns one float (or None: not
applicable) per completion; `runner` calls it in the scorer's worker processes.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from locojax.rewards.code_digest import code_digest

WARM = "warm:"
"""Prefix of a worker preload entry naming a function to call (no arguments) before work."""


class RewardFnError(ValueError):
    """A reward function of the user's cannot be loaded or broke its contract (one line)."""


def split_spec(spec: str) -> tuple[str, str]:
    """(`<file.py>` or `<module>`, `<function>`) of `spec`; RewardFnError when malformed."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise RewardFnError(f"reward function {spec!r}: write <path/to/file.py>:<function> "
                            f"or <module>:<function>")
    return where, name


def load_fn(spec: str) -> Callable[..., Any]:
    """The function `spec` names, imported from its file or module."""
    where, name = split_spec(spec)
    try:
        if where.endswith(".py"):
            path = Path(where).expanduser().resolve()
            if not path.is_file():
                raise RewardFnError(f"reward function {spec!r}: no file {path}")
            mod_name = f"locojax_user_reward_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
            module = sys.modules.get(mod_name)
            if module is None:
                loader = importlib.util.spec_from_file_location(mod_name, path)
                assert loader is not None and loader.loader is not None
                module = importlib.util.module_from_spec(loader)
                sys.modules[mod_name] = module
                loader.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except RewardFnError:
        raise
    except Exception as e:
        raise RewardFnError(f"reward function {spec!r}: cannot import {where}: "
                            f"{type(e).__name__}: {first_line(e)}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RewardFnError(f"reward function {spec!r}: {where} has no function {name!r}")
    return fn


def fn_digest(spec: str) -> str:
    """The digest of the file a spec names (a module's file where it has one) and of the local
    modules it imports (`code_digest`), for the run record; "missing" without a file."""
    where, _ = split_spec(spec)
    if where.endswith(".py"):
        path = Path(where).expanduser()
    else:
        found = importlib.util.find_spec(where)
        path = Path(found.origin) if found is not None and found.origin else None
    if path is None or not path.is_file():
        return "missing"
    return code_digest(path)


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__

"""On-disk cache of built tokenizers (`tokenizer.json` files), safe under concurrent processes."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import tokenizers as tk

CACHE_ENV = "LOCOJAX_CACHE_DIR"
"""Environment variable overriding the cache root (default `~/.cache/locojax`)."""


def cache_dir() -> Path:
    """Folder holding cached tokenizers: `$LOCOJAX_CACHE_DIR/tokenizers` or the default."""
    root = os.environ.get(CACHE_ENV) or "~/.cache/locojax"
    return Path(root).expanduser() / "tokenizers"


def _publish(tmp: Path, path: Path) -> bool:
    """Move `tmp` to `path` unless another process got there first; True if ours is there."""
    try:
        # A hard link fails if `path` exists, so every process ends up using the same file
        # even when builds differ (BPE training need not be bit-reproducible across runs).
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError:
        os.replace(tmp, path)  # file system without hard links: last writer wins, still atomic
    return True


def cached_tokenizer(name: str, build: Callable[[], tk.Tokenizer]) -> tk.Tokenizer:
    """Load `name` from the cache, or build it and publish it atomically (first writer wins)."""
    path = cache_dir() / name
    if path.exists():
        try:
            return tk.Tokenizer.from_file(str(path))
        except Exception:  # unreadable (e.g. written by an incompatible version): rebuild
            path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    built = build()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.chmod(0o644)  # mkstemp makes it private; the cache is readable like any cache
    try:
        built.save(str(tmp))
        ours = _publish(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return built if ours else tk.Tokenizer.from_file(str(path))

"""Rows of a data set split from local jsonl files or the Hugging Face hub, through `datasets`
(`workload.dataset` / `data_dir`; `files` reads `workload.data_files`)."""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from locojax.data.problem import DataError, WorkloadSettings

OFFLINE_HINTS = {"gsm8k": "../shared/data/gsm8k", "numina_cot": "../shared/data/math500"}
"""Local copies suggested in error messages."""
HUB_PROBE_TIMEOUT_S = 3.0
"""`datasets` retries an unreachable hub for ~25 s; a socket probe fails in this time."""


def quiet_datasets():
    """`datasets`, imported with its INFO lines and progress bars off (a run's first lines
    say where the data comes from; a batch log keeps no carriage-return bars)."""
    logging.getLogger("datasets").setLevel(logging.WARNING)
    import datasets

    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity_warning()
    return datasets


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def _hint(settings: WorkloadSettings) -> str:
    where = OFFLINE_HINTS.get(settings.name, "<dir with <split>.jsonl>")
    return f"point at local files with workload.data_dir={where}"


def split_file(settings: WorkloadSettings, split: str) -> Path:
    """The jsonl file holding a split: `<data_dir>/<split>.jsonl`, or data_dir itself if a file."""
    root = Path(settings.data_dir or ".").expanduser()
    if root.is_file():
        return root
    path = root / f"{split}.jsonl"
    if path.exists() and not path.is_file():
        raise DataError(f"{settings.name}: {path} is not a file (workload.data_dir="
                        f"{settings.data_dir}, split {split!r})")
    if not path.is_file():
        found = sorted(p.name for p in root.glob("*.jsonl")) if root.is_dir() else []
        raise DataError(
            f"{settings.name}: no file {path} (workload.data_dir={settings.data_dir}, "
            f"split {split!r}; jsonl files there: {found or 'none'}); set "
            f"workload.train_split/eval_split to one of them, or data_dir to one file"
        )
    return path


class BadLine(str):
    """A line that cannot be a row; the text says why (skipped and counted like one)."""


def read_jsonl(path: Path) -> list[object]:
    """Plain reader for files `datasets` rejects or cannot decode; a line that is not JSON
    becomes None, one that is not UTF-8 a `BadLine`."""
    rows: list[object] = []
    with path.open("rb") as f:
        for raw in f:
            try:
                line = raw.decode("utf-8-sig" if not rows else "utf-8")
            except UnicodeDecodeError as err:
                rows.append(BadLine(f"not UTF-8 (byte {raw[err.start]:#04x} at column "
                                    f"{err.start + 1})"))
                continue
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                rows.append(None)
    return rows


def _columns(table, settings: WorkloadSettings, source: str) -> list[object]:
    """The rows, reduced to the question and answer fields (which must be columns), or whole
    where an environment of the user's reads every column (`settings.columns`)."""
    keys = ["messages_field" if settings.messages_field else "question_field", "answer_field"]
    fields = [settings.messages_field or settings.question_field, settings.answer_field]
    if settings.messages_field and settings.answer_field not in table.column_names:
        keys, fields = keys[:1], fields[:1]  # the answer is the final assistant message
    for key, name in zip(keys, fields, strict=True):
        if name not in table.column_names:
            raise DataError(
                f"{settings.name}: {source} has no column {name!r} (workload.{key}; "
                f"columns: {table.column_names})"
            )
    if settings.columns:
        return table.to_list()
    return table.select_columns(fields).to_list()


def offline() -> bool:
    return any(os.environ.get(k, "").strip() for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_unreachable() -> str | None:
    """Why the hub cannot be reached, or None when it can (or a proxy or offline mode decides)."""
    if offline():
        return None  # datasets fails at once or uses its cache
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # a direct probe says nothing about the proxy
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError as e:
        return f"{url.hostname}:{port} unreachable: {e}"
    return None


def load_rows(settings: WorkloadSettings, split: str) -> tuple[list[object], str]:
    """All rows of a split (dicts; None for unparsable lines) and where they came from."""
    datasets = quiet_datasets()  # ~2 s to import: only workloads with data sets pay it

    if settings.data_dir is not None:
        path = split_file(settings, split)
        try:
            table = datasets.load_dataset("json", data_files=str(path), split="train")
            return _columns(table, settings, str(path)), str(path)
        except DataError:
            raise
        except Exception:  # a bad line (JSON or UTF-8) fails the whole file: line by line
            return read_jsonl(path), str(path)
    if not settings.dataset:
        raise DataError(f"{settings.name}: no workload.dataset and no data_dir; {_hint(settings)}")
    config = settings.dataset_config
    source = f"hub {settings.dataset}" + (f" ({config})" if config else "")
    reason = hub_unreachable()
    if reason is None:
        try:
            table = datasets.load_dataset(settings.dataset, config, split=split)
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"
        else:
            return _columns(table, settings, source), f"{source} split {split}"
    cache_hint = "" if offline() else ", or set HF_HUB_OFFLINE=1 to use a cached copy"
    raise DataError(
        f"{settings.name}: cannot load {source} split {split!r} ({one_line(reason)[:300]}); "
        f"{_hint(settings)}{cache_hint}"
    )

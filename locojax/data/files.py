"""Rows of `workload.data_files[split]`: a local file, a directory `datasets` saved, or a hub name.

    value ──an existing file──> JSONL, JSON, Parquet or CSV through `datasets` (a JSONL file
                                 it rejects: line by line, bad lines become rows to skip)
          ──an existing directory──> `datasets.load_from_disk` (a DatasetDict: the split)
          ──`org/name` or `org/name:split`──> `datasets.load_dataset` (default split: the
                                 workload's train_split or eval_split)

A failure is one line naming the key and the value (a `DataError`).
"""

from __future__ import annotations

import re
from pathlib import Path

from locojax.data.problem import DataError
from locojax.data.sources import hub_unreachable, offline, one_line, quiet_datasets, read_jsonl

FILE_KINDS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
"""File endings `workload.data_files` reads, and the `datasets` builder of each."""
HUB_NAME_RE = re.compile(r"[\w.-]+/[\w.-]+(?::[\w.-]+)?")
"""A hub data set name, `org/name`, optionally `:split`."""


def read_file_rows(value: str, split: str, default_split: str) -> tuple[list[object], str]:
    """All rows of `workload.data_files.<split>` = value, and where they came from."""
    path = Path(value).expanduser()
    key = f"workload.data_files.{split}={value}"
    if path.is_dir():
        return _disk_rows(path, key, default_split), str(path)
    if not path.exists() and path.suffix.lower() not in FILE_KINDS \
            and HUB_NAME_RE.fullmatch(value):
        return _hub_rows(value, key, default_split)
    return _file_rows(path, key), str(path)


def _file_rows(path: Path, key: str) -> list[object]:
    datasets = quiet_datasets()  # ~2 s to import: only workloads with data sets pay it

    kind = FILE_KINDS.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"{key}: {path} is not one of {', '.join(FILE_KINDS)}, a directory "
                        f"saved by datasets, or a hub name org/name[:split]")
    if not path.is_file():
        raise DataError(f"{key}: no file {path}")
    try:
        return datasets.load_dataset(kind, data_files=str(path), split="train").to_list()
    except Exception as e:
        if path.suffix.lower() == ".jsonl":
            return read_jsonl(path)
        raise DataError(f"{key}: cannot read {path}: {type(e).__name__}: "
                        f"{one_line(e)[:200]}") from None


def _disk_rows(path: Path, key: str, split: str) -> list[object]:
    """Rows of a `Dataset` (or the `split` of a `DatasetDict`) saved with `save_to_disk`."""
    datasets = quiet_datasets()

    try:
        table = datasets.load_from_disk(str(path))
    except Exception as e:
        raise DataError(f"{key}: a directory, but not one datasets saved (save_to_disk): "
                        f"{type(e).__name__}: {one_line(e)[:200]}") from None
    if isinstance(table, datasets.DatasetDict):
        if split not in table:
            raise DataError(f"{key}: no split {split!r} in the saved DatasetDict (splits: "
                            f"{', '.join(table)})")
        table = table[split]
    return table.to_list()


def _hub_rows(value: str, key: str, default_split: str) -> tuple[list[object], str]:
    """Rows of a hub data set `org/name[:split]`; where the hub cannot be reached, one line."""
    datasets = quiet_datasets()

    name, _, split = value.partition(":")
    split = split or default_split
    reason = hub_unreachable()
    if reason is None:
        try:
            table = datasets.load_dataset(name, split=split)
            return table.to_list(), f"hub {name} split {split}"
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"
    cache = "" if offline() else "; HF_HUB_OFFLINE=1 uses a cached copy"
    raise DataError(f"{key}: cannot load hub data set {name} split {split!r} "
                    f"({one_line(reason)[:300]}); pass a local file or directory{cache}")

"""Load a workload's train and eval problems; malformed rows are counted, reported once, skipped."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from compiler.vocab import RewardKind
from locojax.data.arith import arith_problems
from locojax.data.files import read_file_rows
from locojax.data.gym import gym_rows
from locojax.data.problem import DataError, Problem, WorkloadSettings
from locojax.data.rows import row_prompt
from locojax.data.sources import load_rows
from locojax.hubs import HubError, hub_of
from locojax.rewards.builtin import BUILTINS, builtin

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Workload:
    """Problems to train on and to evaluate on."""

    name: str
    train: Sequence[Problem]
    eval: Sequence[Problem]
    skipped: int
    """Malformed rows left out, over both splits."""


def reference_answer(solution: str, reward: str) -> str | None:
    """The final answer a reference solution states, in the reward's format, or None."""
    return builtin(reward).reference(solution)


def problems_from_rows(
    rows: Sequence[object], settings: WorkloadSettings, split: str, source: str
) -> tuple[list[Problem], int]:
    """Problems of the well-formed rows, and how many rows were skipped (logged once)."""
    problems: list[Problem] = []
    bad, first = 0, ""
    marker = builtin(settings.reward).marker
    for row_number, row in enumerate(rows, start=1):
        got = row_prompt(row, settings)
        if isinstance(got, str):
            why = got
        elif got.answer is None:
            name = settings.answer_field
            value = row.get(name) if isinstance(row, dict) else None
            why = f"field {name!r} is {type(value).__name__ if name in row else 'missing'}"
        else:
            answer = reference_answer(got.answer, settings.reward)
            if answer is not None:
                uid = f"{settings.name}/{split}/{row_number - 1}"
                columns = dict(row) if settings.columns and isinstance(row, dict) else None
                problems.append(Problem(uid, got.question, answer, got.answer, columns,
                                        messages=got.messages))
                continue
            why = f"no {marker} in {settings.answer_field!r}"
        bad += 1
        first = first or f"row {row_number} of {source}: {why}"
    if bad:
        log.warning(
            "%s: skipped %d malformed of %d rows (first: %s)", settings.name, bad, len(rows), first
        )
    if not problems:
        raise DataError(f"{settings.name}: no usable rows in {source} ({first or 'empty'})")
    return problems, bad


def _file_problems(settings: WorkloadSettings, split: str) -> tuple[list[Problem], int]:
    """Problems of `workload.data_files[split]`; every column but the question's kept for
    reward functions. A column missing from the file names the file, row and field."""
    default = settings.train_split if split == "train" else settings.eval_split
    rows, source = read_file_rows(settings.data_files[split], split, default)
    required = [("messages_field", settings.messages_field) if settings.messages_field
                else ("question_field", settings.question_field)]
    if settings.reward != RewardKind.python and not settings.messages_field:
        required.append(("answer_field", settings.answer_field))
    for row_number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            continue
        for key, name in required:
            if name not in row:
                raise DataError(f"{source}: row {row_number} has no field {name!r} "
                                f"(workload.{key}; fields: {', '.join(map(str, row))})")
        break
    if settings.reward != RewardKind.python:
        return problems_from_rows(rows, settings, split, source)
    return python_problems(rows, settings, split, source)


def python_problems(rows: Sequence[object], settings: WorkloadSettings, split: str,
                    source: str) -> tuple[list[Problem], int]:
    """Problems of rows scored by reward functions (`reward=python`): every column but the
    question's kept for them, the answer field's value (or a final assistant message) as the
    reference; malformed rows skipped and counted (logged once)."""
    problems, bad, first = [], 0, ""
    for row_number, row in enumerate(rows, start=1):
        got = row_prompt(row, settings)
        if isinstance(got, str):
            bad += 1
            first = first or f"row {row_number} of {source}: {got}"
            continue
        assert isinstance(row, dict)
        answer = row.get(settings.answer_field, got.answer)
        drop = settings.question_field if settings.messages_field is None else None
        columns = {k: v for k, v in row.items() if k != drop}
        problems.append(Problem(f"{settings.name}/{split}/{row_number - 1}", got.question,
                                "" if answer is None else str(answer), None, columns,
                                got.messages))
    if bad:
        log.warning("%s: skipped %d malformed of %d rows (first: %s)", settings.name, bad,
                    len(rows), first)
    if not problems:
        raise DataError(f"{settings.name}: no usable rows in {source} ({first or 'empty'})")
    return problems, bad


def eval_mask(n: int, fraction: float) -> list[bool]:
    """Which of n rows are held out for evaluation: each row by a hash of its index, so the
    same rows on every run and host (at least one row each side when n >= 2)."""
    cut = int(fraction * 2**64)
    out = [int.from_bytes(hashlib.sha256(str(i).encode()).digest()[:8], "big") < cut
           for i in range(n)]
    if fraction > 0 and n >= 2 and not any(out):
        out[0] = True
    if n >= 2 and all(out):
        out[0] = False
    return out


def _load_data_files(settings: WorkloadSettings) -> Workload:
    unknown = sorted(set(settings.data_files) - {"train", "eval"})
    if unknown or "train" not in settings.data_files:
        raise DataError(f"workload.data_files: name a train file and optionally an eval file "
                        f"(+workload.data_files.train=<file>); got {sorted(settings.data_files)}")
    if not 0 <= settings.eval_fraction < 1:
        raise DataError(f"workload.eval_fraction={settings.eval_fraction}: use a value in [0, 1)")
    train, bad = _file_problems(settings, "train")
    if "eval" in settings.data_files:
        held, bad_eval = _file_problems(settings, "eval")
        return Workload(settings.name, train, held, bad + bad_eval)
    if settings.eval_fraction == 0:
        return Workload(settings.name, train, train, bad)
    mask = eval_mask(len(train), settings.eval_fraction)
    if all(mask):
        raise DataError(f"workload.eval_fraction={settings.eval_fraction}: holds out every one "
                        f"of the {len(train)} usable rows of workload.data_files.train, leaving "
                        "none to train on; add rows, or give an eval file")
    return Workload(settings.name, [p for p, m in zip(train, mask, strict=True) if not m],
                    [p for p, m in zip(train, mask, strict=True) if m], bad)


def _hub_problems(settings: WorkloadSettings) -> Workload | None:
    """A hub environment's rows (`locojax.hubs`), `eval_fraction` of them held out as data
    files' are; None when `workload.env` names no hub."""
    try:
        hub = hub_of(settings.env)
        if hub is None:
            return None
        if settings.data_files:
            raise HubError(f"workload.data_files: workload.env={settings.env} brings its own "
                           "rows (its episodes are built from them); leave data_files empty")
        rows, source = hub[0].rows(hub[1], dict(settings.env_args))
    except HubError as e:
        raise DataError(str(e)) from None
    train, bad = python_problems(rows, settings, "train", source)
    mask = eval_mask(len(train), settings.eval_fraction)
    if settings.eval_fraction == 0 or all(mask):
        return Workload(settings.name, train, train, bad)
    return Workload(settings.name, [p for p, m in zip(train, mask, strict=True) if not m],
                    [p for p, m in zip(train, mask, strict=True) if m], bad)


def load_workload(settings: WorkloadSettings, seed: int) -> Workload:
    """Train and eval problems of a workload: the user's files (`data_files`), a hub
    environment's rows, generated (a reasoning-gym task, `arith`), or read through
    `datasets`."""
    if (hub := _hub_problems(settings)) is not None:
        return hub
    if settings.data_files:
        return _load_data_files(settings)
    if settings.reasoning_gym.task:
        splits = []
        for split in ("train", "eval"):
            rows, source = gym_rows(settings.reasoning_gym, split)
            splits.append(python_problems(rows, settings, split, source))
        (train, bad), (held_out, bad_eval) = splits
        return Workload(settings.name, train, held_out, bad + bad_eval)
    if settings.name == "arith":
        train, held_out = arith_problems(settings.arith, seed)
        return Workload(settings.name, train, held_out, 0)
    if settings.reward not in BUILTINS:
        raise DataError(f"workload.reward='{settings.reward}': set workload.data_files for "
                        f"reward functions of the user's (or a hub's workload.env: "
                        f"verifiers:..., openenv:...), or use gsm8k or boxed")
    if settings.data_dir is not None and Path(settings.data_dir).expanduser().is_file():
        # One file serves both splits: read it once, name its rows after the file.
        rows, source = load_rows(settings, settings.train_split)
        problems, bad = problems_from_rows(rows, settings, Path(source).stem, source)
        return Workload(settings.name, problems, problems, bad)
    splits = []
    for split in (settings.train_split, settings.eval_split):
        rows, source = load_rows(settings, split)
        splits.append(problems_from_rows(rows, settings, split, source))
    (train, bad_train), (held_out, bad_eval) = splits
    return Workload(settings.name, train, held_out, bad_train + bad_eval)

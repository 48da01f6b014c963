"""Load a workload's train and eval problems; malformed rows are counted, reported once, skipped."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from compiler.vocab import RewardKind
from locojax.data.arith import arith_problems
from locojax.data.problem import DataError, Problem, WorkloadSettings
from locojax.data.sources import BadLine, load_rows
from locojax.rewards.extract import hash_answer, last_boxed, normalize_number

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
    if reward == RewardKind.boxed:
        return last_boxed(solution) or None
    tagged = hash_answer(solution)
    return normalize_number(tagged) if tagged is not None else None


def _why_malformed(row: object, settings: WorkloadSettings) -> str | None:
    if isinstance(row, BadLine):
        return str(row)
    if not isinstance(row, dict):
        return "not a JSON object"
    for name in (settings.question_field, settings.answer_field):
        value = row.get(name)
        if not isinstance(value, str) or not value.strip():
            return f"field {name!r} is {type(value).__name__ if name in row else 'missing'}"
    return None


def problems_from_rows(
    rows: Sequence[object], settings: WorkloadSettings, split: str, source: str
) -> tuple[list[Problem], int]:
    """Problems of the well-formed rows, and how many rows were skipped (logged once)."""
    problems: list[Problem] = []
    bad, first = 0, ""
    marker = "\\boxed{}" if settings.reward == RewardKind.boxed else "'####' number"
    for row_number, row in enumerate(rows, start=1):
        why = _why_malformed(row, settings)
        if why is None:
            assert isinstance(row, dict)
            solution = row[settings.answer_field]
            answer = reference_answer(solution, settings.reward)
            if answer is not None:
                uid = f"{settings.name}/{split}/{row_number - 1}"
                problems.append(Problem(uid, row[settings.question_field], answer, solution))
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


def load_workload(settings: WorkloadSettings, seed: int) -> Workload:
    """Train and eval problems of a workload: generated (`arith`) or read through `datasets`."""
    if settings.name == "arith":
        train, held_out = arith_problems(settings.arith, seed)
        return Workload(settings.name, train, held_out, 0)
    if settings.reward not in (RewardKind.gsm8k, RewardKind.boxed):
        raise DataError(f"workload.reward={settings.reward!r}: use gsm8k or boxed")
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

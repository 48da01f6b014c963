"""Arithmetic problems generated from a seed ("3+5=" -> "#### 8"), train and eval disjoint.

A sum of two operands also carries its reference episode with the `add` tool (the warm-up of
`+experiment=arith_tools_co`): `<tool_call>{"name": "add", ...}</tool_call>`, "8", "#### 8".

The eval set holds `eval_size` distinct problems, at most a fifth of all possible ones so
training keeps the rest; train problem i is drawn from its own seeded generator, rejecting
eval problems, so the train set is a lazy sequence of any length at O(1) per item.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from typing import overload

from locojax.data.problem import ArithSettings, DataError, Problem

OPS = "+-*"


def validate(settings: ArithSettings) -> None:
    """Raise DataError naming the `workload.arith` key that is out of range."""
    s = settings
    checks = [
        (lambda: s.min_operand >= 0, f"workload.arith.min_operand={s.min_operand} must be >= 0"),
        (lambda: s.max_operand >= s.min_operand,
         f"workload.arith.max_operand={s.max_operand} < min"),
        (lambda: s.terms >= 1, f"workload.arith.terms={s.terms} must be >= 1"),
        (lambda: bool(s.ops) and set(s.ops) <= set(OPS),
         f"workload.arith.ops={s.ops!r}: use {OPS}"),
        (lambda: s.train_size >= 1, f"workload.arith.train_size={s.train_size} must be >= 1"),
        (lambda: problem_space(s) >= 5, "workload.arith: fewer than 5 distinct problems"),
    ]
    for ok, message in checks:  # in order: problem_space needs the checks before it
        if not ok():
            raise DataError(message)


def problem_space(settings: ArithSettings) -> int:
    """How many distinct questions the settings can produce."""
    values = settings.max_operand - settings.min_operand + 1
    return values**settings.terms * len(set(settings.ops)) ** (settings.terms - 1)


def evaluate(operands: Sequence[int], ops: Sequence[str]) -> int:
    """Value of `a op b op c ...` with `*` binding tighter than `+` and `-`."""
    total, product, sign = 0, operands[0], 1
    for op, x in zip(ops, operands[1:], strict=True):
        if op == "*":
            product *= x
        else:
            total += sign * product
            product, sign = x, (1 if op == "+" else -1)
    return total + sign * product


def draw(rng: random.Random, settings: ArithSettings) -> tuple[str, int]:
    """One random question ("3+5=") and its value."""
    operands = [
        rng.randint(settings.min_operand, settings.max_operand) for _ in range(settings.terms)
    ]
    ops = [rng.choice(settings.ops) for _ in range(settings.terms - 1)]
    text = str(operands[0]) + "".join(op + str(x) for op, x in zip(ops, operands[1:], strict=True))
    return text + "=", evaluate(operands, ops)


_SUM = re.compile(r"(\d+)\+(\d+)=")


def add_tool_episode(a: int, b: int) -> tuple[tuple[str, str], ...]:
    """The reference episode of `a+b=` with the built-in `add` tool (`envs.calculator.add`):
    a call in Qwen3's format, its result, the answer."""
    call = json.dumps({"name": "add", "arguments": {"a": a, "b": b}})
    return (("assistant", f"<tool_call>\n{call}\n</tool_call>"), ("tool", str(a + b)),
            ("assistant", f"#### {a + b}"))


def _problem(uid: str, question: str, value: int) -> Problem:
    """A generated problem; a sum of two operands carries its `add` tool episode."""
    terms = _SUM.fullmatch(question)
    reference = add_tool_episode(*map(int, terms.groups())) if terms else None
    return Problem(uid=uid, question=question, answer=str(value), solution=f"#### {value}",
                   reference=reference)


def _key(settings: ArithSettings, seed: int) -> str:
    s = settings
    return f"{seed}:{s.min_operand}:{s.max_operand}:{s.terms}:{s.ops}"


def eval_problems(settings: ArithSettings, seed: int) -> list[Problem]:
    """Distinct held-out problems: min(eval_size, space // 5) of them."""
    validate(settings)
    want = min(settings.eval_size, problem_space(settings) // 5)
    rng = random.Random(f"arith-eval:{_key(settings, seed)}")
    seen: dict[str, int] = {}
    while len(seen) < want:  # each draw is new with probability >= 4/5
        question, value = draw(rng, settings)
        seen.setdefault(question, value)
    return [_problem(f"arith/eval/{i}", q, v) for i, (q, v) in enumerate(seen.items())]


class ArithTrain(Sequence[Problem]):
    """`train_size` training problems, each made on access; none is in the eval set."""

    def __init__(self, settings: ArithSettings, seed: int, held_out: Sequence[Problem]) -> None:
        validate(settings)
        self.settings = settings
        self._key = _key(settings, seed)
        self._held_out = frozenset(p.question for p in held_out)

    def __len__(self) -> int:
        return self.settings.train_size

    @overload
    def __getitem__(self, index: int) -> Problem: ...
    @overload
    def __getitem__(self, index: slice) -> list[Problem]: ...
    def __getitem__(self, index: int | slice) -> Problem | list[Problem]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = range(len(self))[index]  # bounds check and negative indices
        rng = random.Random(f"arith-train:{self._key}:{i}")
        while True:
            question, value = draw(rng, self.settings)
            if question not in self._held_out:
                return _problem(f"arith/train/{i}", question, value)


def arith_problems(settings: ArithSettings, seed: int) -> tuple[ArithTrain, list[Problem]]:
    """The (train, eval) problems of the arithmetic workload for a seed."""
    held_out = eval_problems(settings, seed)
    return ArithTrain(settings, seed, held_out), held_out

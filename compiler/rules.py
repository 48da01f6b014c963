"""The range rules' language: what a config field's value must meet, each rule stating its
text (the words the field's docstring holds) and its numbers.

    Bound, OneOf, Chars, Subset, Even, FormatFields, Finite   a field's own rules
    AtLeast, Check                                            relations to other fields

`compiler.passes.ranges` holds the table (`FIELD_RULES`) and the pass that runs it.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compiler.config import Config
from compiler.errors import value_at


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


@dataclass(frozen=True)
class Bound:
    """lo <= value <= hi (either end open or absent); `also` lists allowed exceptions (0: off)."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    also: tuple[float, ...] = ()

    @property
    def text(self) -> str:
        if self.lo is not None and self.hi is not None:
            core = (f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}"
                    f"{')' if self.hi_open else ']'}")
        elif self.lo is not None:
            core = f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        else:
            core = f"{'<' if self.hi_open else '<='} {_num(self.hi)}"
        return " or ".join([*map(_num, self.also), core])

    def holds(self, value: float, cfg: Config) -> bool:
        if value in self.also:
            return True
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return not (self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi))

    def detail(self, cfg: Config) -> str:
        return ""


@dataclass(frozen=True)
class OneOf:
    """The value is one of `values`."""

    values: tuple[Any, ...]

    @property
    def text(self) -> str:
        return "one of " + ", ".join(map(str, self.values))

    def holds(self, value: Any, cfg: Config) -> bool:
        return value in self.values

    def detail(self, cfg: Config) -> str:
        return ""


@dataclass(frozen=True)
class Chars:
    """A non-empty string of characters from `alphabet`."""

    alphabet: str

    @property
    def text(self) -> str:
        return f"non-empty, characters of {self.alphabet}"

    def holds(self, value: str, cfg: Config) -> bool:
        return bool(value) and set(value) <= set(self.alphabet)

    def detail(self, cfg: Config) -> str:
        return ""


@dataclass(frozen=True)
class Subset:
    """A non-empty list of distinct members of `values`."""

    values: tuple[str, ...]

    @property
    def text(self) -> str:
        return "non-empty, each one of " + ", ".join(self.values) + ", no repeats"

    def holds(self, value: Any, cfg: Config) -> bool:
        items = list(value)
        return bool(items) and set(items) <= set(self.values) and len(set(items)) == len(items)

    def detail(self, cfg: Config) -> str:
        return ""


@dataclass(frozen=True)
class Even:
    """An even integer."""

    text: str = "even"

    def holds(self, value: int, cfg: Config) -> bool:
        return value % 2 == 0

    def detail(self, cfg: Config) -> str:
        return ""


def _field_names(template: str) -> list[str]:
    """Replacement field names of a format string, nested specs included (`{a.b}`: `a.b`)."""
    names = []
    for _, name, spec, _ in string.Formatter().parse(template):
        if name is not None:
            names.append(name)
            names += _field_names(spec or "")
    return names


@dataclass(frozen=True)
class FormatFields:
    """A `str.format` template whose only replacement fields are `fields`."""

    fields: tuple[str, ...]

    @property
    def text(self) -> str:
        return "a template using only " + ", ".join("{" + f + "}" for f in self.fields)

    def holds(self, value: str, cfg: Config) -> bool:
        try:
            value.format(**dict.fromkeys(self.fields, ""))  # conversions, specs, lone braces
            return all(name in self.fields for name in _field_names(value))
        except (KeyError, IndexError, ValueError, AttributeError):
            return False

    def detail(self, cfg: Config) -> str:
        return " (write {{ }} for a literal brace)"


@dataclass(frozen=True)
class Finite:
    """None or a finite number: the finite pass every float field gets, stated as the rule of
    an optional float that has no bound (the finite pass rejects a value first)."""

    text: str = "None or a finite number"

    def holds(self, value: float | None, cfg: Config) -> bool:
        return value is None or math.isfinite(value)

    def detail(self, cfg: Config) -> str:
        return ""


@dataclass(frozen=True)
class AtLeast:
    """value >= the value of another config key."""

    other: str

    @property
    def reads(self) -> tuple[str, ...]:
        return (self.other,)

    @property
    def text(self) -> str:
        return f">= {self.other}"

    def holds(self, value: float, cfg: Config) -> bool:
        return value >= value_at(cfg, self.other)

    def detail(self, cfg: Config) -> str:
        return f"={value_at(cfg, self.other)}"


@dataclass(frozen=True)
class Check:
    """A relation to other fields, stated in words; `detail` adds the numbers to the message."""

    text: str
    test: Callable[[Any, Config], bool]
    numbers: Callable[[Config], str]
    reads: tuple[str, ...] = ()
    """Other keys the relation reads; it is skipped when one of them is itself out of range."""

    def holds(self, value: Any, cfg: Config) -> bool:
        return self.test(value, cfg)

    def detail(self, cfg: Config) -> str:
        return f" ({self.numbers(cfg)})"


Rule = Bound | OneOf | Chars | Subset | Even | Finite | FormatFields | AtLeast | Check
RELATIONS = (AtLeast, Check)
"""Rule kinds that read other fields: checked after every field's own rules."""

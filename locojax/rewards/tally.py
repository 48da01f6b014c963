"""Failures of the user's code of one kind (an environment, its tools, a reward function),
counted between two reports and told in one line: however many batches, turns or workers a
step runs them in, a step says each kind once (`runtime.hostwork.say_failures`).

    Tally.add(count, first) ... Tally.add(...)  (any thread)
    Tally.take() -> "<what> failed in <n> <unit>; first: <first>" | None (none since the last)
"""

from __future__ import annotations

import threading


class Tally:
    """One kind's failures since the last `take`: how many, and the first; thread-safe."""

    def __init__(self, what: str, unit: str) -> None:
        self.what = what
        """What failed, as the line names it (`environment env.py:Guess`)."""
        self.unit = unit
        """What is counted (`episode turn(s)`, `row(s)`)."""
        self._lock = threading.Lock()
        self._count = 0
        self._first = ""

    def add(self, count: int, first: str) -> None:
        """Count `count` failures; `first` describes the first of them (kept if the first)."""
        if count <= 0:
            return
        with self._lock:
            self._count += count
            self._first = self._first or first

    def take(self) -> str | None:
        """The line of the failures since the last `take` (None: none), and a fresh count."""
        with self._lock:
            count, first, self._count, self._first = self._count, self._first, 0, ""
        if not count:
            return None
        return f"{self.what} failed in {count} {self.unit}; first: {first}"

"""Find and normalise final answers in free text: `#### n`, the last number, the last `\\boxed{}`."""

from __future__ import annotations

import re

_NUMBER = r"[-+]?\$?\s?(?:\d[\d,]*(?:\.\d*)?|\.\d+)"
_HASH_NUMBER_RE = re.compile(r"####\s*(" + _NUMBER + ")")
_NUMBER_RE = re.compile(_NUMBER)
_PLAIN_RE = re.compile(r"(-?)(\d*)(?:\.(\d*))?")
# Atomic group and lookbehind keep this linear on a 100k-digit run (no backtracking).
_SCIENTIFIC_RE = re.compile(r"(?<![\d.])(?>\d*\.?\d+)[eE][-+]?\d+")
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_RE = re.compile(r"(?<!\\)[{}]")
MAX_NUMBER_CHARS = 4096
"""Longer digit runs are not numbers anyone means; rejecting them keeps scoring cheap."""


def hash_answer(text: str) -> str | None:
    """Return the number after the last `####` marker, or None if there is none.

    Scientific notation (`1e999999`) is not a plain number: it is blanked out first, so
    neither its mantissa nor its exponent is read as the answer.
    """
    matches = _HASH_NUMBER_RE.findall(_SCIENTIFIC_RE.sub(" ", text))
    return matches[-1] if matches else None


def last_number(text: str) -> str | None:
    """Return the last number-looking run in the text, or None."""
    matches = _NUMBER_RE.findall(_SCIENTIFIC_RE.sub(" ", text))
    return matches[-1] if matches else None


def normalize_number(raw: str) -> str | None:
    """Canonical decimal string of a number like ' +$1,234.50 ' ('1234.5'), or None.

    Exact string arithmetic, not float or a 28-digit Decimal context: two long numbers that
    differ in the last digit stay different.
    """
    s = raw.strip().replace(",", "").replace("$", "").replace(" ", "")
    if s.startswith("+"):
        s = s[1:]
    if len(s) > MAX_NUMBER_CHARS:
        return None
    match = _PLAIN_RE.fullmatch(s)
    if match is None or not (match.group(2) or match.group(3)):
        return None
    sign, whole, frac = match.group(1), match.group(2).lstrip("0") or "0", (match.group(3) or "")
    frac = frac.rstrip("0")
    body = whole + ("." + frac if frac else "")
    return body if body == "0" else sign + body


def last_boxed(text: str) -> str | None:
    """Return the content of the last closed `\\boxed{...}` (nested braces matched), or None."""
    starts = {m.end() - 1 for m in _BOXED_RE.finditer(text)}
    if not starts:
        return None
    # One pass pairs every unescaped brace, so unbalanced text of any length costs O(n).
    best: tuple[int, int] | None = None
    stack: list[int] = []
    for m in _BRACE_RE.finditer(text):
        if m.group(0) == "{":
            stack.append(m.start())
        elif stack:
            open_at = stack.pop()
            if open_at in starts and (best is None or open_at > best[0]):
                best = (open_at, m.start())
    return text[best[0] + 1 : best[1]].strip() if best is not None else None

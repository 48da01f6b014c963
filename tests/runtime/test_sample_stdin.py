"""`locojax-sample`'s prompt from standard input: read whole up to a cap (issue 41: an
unbounded stream was read into memory), strictly UTF-8, one line otherwise."""

import io
import sys

import pytest

from locojax.runtime.errors import UserError
from locojax.sample.complete import STDIN_LIMIT, read_stdin


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_a_prompt_up_to_the_cap_is_read_and_one_past_it_is_one_line(monkeypatch):
    _stdin(monkeypatch, b"3+5=\n")
    assert read_stdin() == "3+5=\n"
    _stdin(monkeypatch, b"y\n" * (STDIN_LIMIT // 2))
    assert len(read_stdin()) == STDIN_LIMIT
    _stdin(monkeypatch, b"y\n" * (STDIN_LIMIT // 2) + b"y")
    with pytest.raises(UserError, match=r"^prompt: standard input holds more than 8 MiB"):
        read_stdin()
    _stdin(monkeypatch, b"ok \xff")
    with pytest.raises(UserError, match=r"not UTF-8 \(byte 0xff at offset 3\)"):
        read_stdin()

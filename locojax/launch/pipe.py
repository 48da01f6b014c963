"""Standard output that outlives its reader: `python -m locojax ... | head` must not end a run.

    door() -> quiet_closed_stdout()    sys.stdout wrapped once per process: the first write or
                                       flush that finds the reader gone (EPIPE) points fd 1
                                       at /dev/null and drops every later one; the run goes
                                       on (its files, its stderr lines and its exit code as
                                       without the pipe)

The local launcher's hosts write to pipes the launcher reads, so only the launcher's own
stdout meets the closed pipe; its pumps drop the hosts' lines from then on.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO


class ClosedPipeSafe:
    """A text stream whose writes succeed (and are dropped) once its pipe's reader is gone."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        """From now on nothing is written; fd 1 becomes /dev/null, so that what the stream
        still buffers (Python flushes it at exit) has somewhere to go."""
        self.reader_gone = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def quiet_closed_stdout() -> None:
    """Wrap sys.stdout in `ClosedPipeSafe` (once)."""
    if sys.stdout is not None and not isinstance(sys.stdout, ClosedPipeSafe):
        sys.stdout = ClosedPipeSafe(sys.stdout)

"""`\\boxed{}` answer equivalence through math-verify, in a worker process with a time limit.

math-verify's own timeouts use `signal.alarm`, which fails outside the main thread, and a
thread cannot be stopped: sympy can spend minutes inside one C call (`9^{9^{9^9}}`). So the
checks run in a worker process (`verify_worker`) that is killed and replaced when one exceeds
its limit.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

GSM8K = "gsm8k"
"""Tag of a chunk of GSM8K verdicts sent to the worker (here, not in `verify_worker`: the
package must not import the module that `python -m` runs)."""
MAX_ANSWER_CHARS = 1000
"""Boxed answers longer than this are scored wrong without a parse (MATH500's longest: 73)."""
_SPACE_RE = re.compile(r"\s+")


def quick_match(pred: str, gold: str) -> bool:
    """Whether two answers are equal as written, ignoring whitespace (skips a parse)."""
    return _SPACE_RE.sub("", pred) == _SPACE_RE.sub("", gold)


@dataclass(frozen=True)
class VerifyResult:
    """Equivalence of each pair, and how many pairs timed out or crashed the worker."""

    equal: list[bool]
    timeouts: int
    errors: int


class BoxedVerifier:
    """Checks answer equivalence in one worker process; a pair past `timeout_s` scores False.

    Thread-safe: concurrent calls take turns on the one worker.
    """

    def __init__(self, timeout_s: float, startup_timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._finalizer: weakref.finalize | None = None

    def _connection(self) -> Connection:
        """The live worker's socket, starting a worker if there is none or it died."""
        alive = self._process is not None and self._process.poll() is None
        if self._conn is not None and alive and not self._conn.poll(0):  # idle: nothing to read
            return self._conn
        self._stop()
        # A plain subprocess: no fork of a process running JAX threads, and unlike
        # multiprocessing's spawn it does not re-run the caller's main module.
        parent, child = socket.socketpair()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "locojax.rewards.verify_worker", str(child.fileno())]
        process = subprocess.Popen(
            cmd, pass_fds=[child.fileno()], env=env, stdin=subprocess.DEVNULL
        )
        child.close()
        conn = Connection(parent.detach())
        self._finalizer = weakref.finalize(self, process.kill)  # no worker outlives us
        try:
            ready = conn.poll(self.startup_timeout_s) and conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        self._process, self._conn = process, conn
        if not ready:
            self._stop()
            raise RuntimeError(f"math-verify worker did not start in {self.startup_timeout_s} s")
        return conn

    def _stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._process is not None:
            self._process.kill()
            self._process.wait()
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = self._finalizer = None

    def verify_many(self, pairs: Sequence[tuple[str, str]]) -> VerifyResult:
        """Equivalence of each (pred, gold) pair, each check limited to `timeout_s`."""
        with self._lock:
            return self._verify_many(pairs)

    def _verify_many(self, pairs: Sequence[tuple[str, str]]) -> VerifyResult:
        equal = [False] * len(pairs)
        timeouts = errors = 0
        i = 0
        while i < len(pairs):
            conn = self._connection()
            try:
                conn.send(list(pairs[i:]))
            except OSError:  # died since the liveness check: start another
                self._stop()
                continue
            while i < len(pairs):
                # The worker starts pair i before pair i-1's answer is read, so each pair
                # gets at least timeout_s.
                try:
                    if conn.poll(self.timeout_s):
                        equal[i] = conn.recv()
                        i += 1
                        continue
                    timeouts += 1
                except (EOFError, OSError):
                    errors += 1  # the worker died on this pair (e.g. a crash in C code)
                self._stop()
                i += 1
                break
        return VerifyResult(equal, timeouts, errors)

    def gsm8k_many(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[bool, bool]] | None:
        """GSM8K (correct, formatted) of each (completion, reference) pair in the worker; None
        when the worker died or took longer than `timeout_s` per pair (the caller scores them
        itself: these verdicts are plain string work that always ends)."""
        with self._lock:
            conn = self._connection()
            try:
                conn.send((GSM8K, list(pairs)))
                if conn.poll(self.timeout_s * max(len(pairs), 1)):
                    return conn.recv()
            except (EOFError, OSError):
                pass
            self._stop()
            return None

    def close(self) -> None:
        """Stop the worker process (a later call starts a new one)."""
        with self._lock:
            self._stop()

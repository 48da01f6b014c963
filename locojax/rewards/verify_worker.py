"""math-verify worker process: `python -m locojax.rewards.verify_worker <socket fd>`.

Receives lists of (pred, gold) answers over the socket, sends one bool per pair; a message
("gsm8k", [(completion, reference), ...]) gets one list of (correct, formatted) back (the
scorer's pool spreads GSM8K verdicts over its workers). Started as a plain subprocess, not
through multiprocessing, so it never re-imports the caller's main module.
"""

from __future__ import annotations

import functools
import logging
import signal
import sys
from multiprocessing.connection import Connection

from math_verify import parse, verify

from locojax.rewards.boxed import GSM8K
from locojax.rewards.gsm8k import gsm8k_verdict


def serve(conn: Connection) -> None:
    """Answer equivalence requests until the parent sends None or goes away."""
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.ERROR)  # it warns that we disabled its timeouts

    @functools.lru_cache(maxsize=4096)
    def parsed(answer: str) -> list:
        return parse("\\boxed{" + answer + "}", parsing_timeout=None)

    def equivalent(pred: str, gold: str) -> bool:
        try:
            return bool(verify(parsed(gold), parsed(pred), timeout_seconds=None))
        except Exception:  # any failure to compare scores as wrong
            return False

    conn.send("ready")
    try:
        while (pairs := conn.recv()) is not None:
            if isinstance(pairs, tuple) and pairs[0] == GSM8K:
                conn.send([gsm8k_verdict(text, ref) for text, ref in pairs[1]])
                continue
            for pred, gold in pairs:
                conn.send(equivalent(pred, gold))
    except (EOFError, OSError):
        pass  # the parent closed the socket or exited


if __name__ == "__main__":
    # Ctrl-C and a launcher's SIGTERM reach the whole process group; the run finishes its step
    # (which needs these verdicts) before it stops, and then ends this worker itself (EOF).
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    sys.setrecursionlimit(10_000)  # deep LaTeX nests; past this a RecursionError scores False
    serve(Connection(int(sys.argv[1])))

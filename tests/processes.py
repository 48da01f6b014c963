"""Waiting for a process of a test's to end (tests/ is on pytest's pythonpath)."""

import time

import psutil


def ended(pid: int, within_s: float) -> bool:
    """Whether `pid` is gone or a zombie, looked at once and then until `within_s` has passed
    (a bound on waiting, not a timing claim)."""
    end = time.monotonic() + within_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)

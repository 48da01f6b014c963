"""Where the tests' shared files are, for every test folder (tests/ is on pytest's pythonpath)."""

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
"""This folder: conftest.py and the shared helpers."""
ROOT = TESTS.parent
"""The repository root (the working directory of subprocess tests)."""
CONF = ROOT / "conf"
FIXTURES = TESTS / "fixtures"
GOLDEN = TESTS / "golden"
WORKERS = TESTS / "workers"
BENCHMARKS = ROOT / "benchmarks"
DATA = Path(os.environ.get("LOCOJAX_DATA_DIR", ROOT.parent / "shared" / "data"))
"""Data sets beside the clone (`../shared/data`), or `LOCOJAX_DATA_DIR`."""

needs_data = pytest.mark.skipif(
    not (DATA / "gsm8k" / "test.jsonl").is_file(), reason=f"no shared data at {DATA}"
)
"""Marks a test that reads the shared data sets."""

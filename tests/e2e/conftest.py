"""Session fixtures of the e2e tests: runs several tests only read (tests/shared_runs.py)."""

from pathlib import Path

import pytest
from shared_runs import FINISHED, shared_run


@pytest.fixture(scope="session")
def finished_co_run(tmp_path_factory) -> Path:
    """`python -m locojax` with FINISHED: the reference of the resume and refusal tests
    (test_user_errors, test_co_runtime's SIGKILL resume) and the single-host run whose files,
    output (`output_of`) and network sockets (none: `sockets_of`) test_co_runtime checks.
    Read it; `copied` to change it."""
    run_dir = shared_run(tmp_path_factory, "finished_co", *FINISHED, audit_sockets=True)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["2", "4"]
    return run_dir

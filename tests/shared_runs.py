"""Runs that several e2e tests only read, trained once per test session (the fixtures are in
tests/e2e/conftest.py).

Under xdist every worker is its own process with its own session: the first worker to ask for a
run trains it under a file lock in the directory all workers share; the others wait for the
lock and read the finished run. A test that changes a run works on a copy (`copied`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import warm
from paths import FIXTURES, ROOT

QUICK = ("+experiment=arith_co", "algorithm.sft_warmup_steps=2", "run.eval_every=0")
"""The smallest CO run that warms up and trains (the refusal and resume tests' base)."""
FINISHED = (*QUICK[:-1], "run.eval_every=4", "run.steps=4", "run.checkpoint_every=2")
"""`finished_co_run`'s overrides: 4 steps, checkpoints at steps 2 and 4, one evaluation, after
the last step's update (the final params are those of the same run without it: the resume
tests pass QUICK's run.eval_every=0, and intervals may change on resume)."""


CHILD_XLA_FLAGS = "--xla_backend_optimization_level=0"
"""XLA flags of every run a test starts: the CPU backend's optimisation passes off (as in the
pytest process, tests/conftest.py). The tiny models' runs are compile-bound: a 2-host arith
run takes 15 s instead of 18 (23 CPU-s instead of 32) with a cold cache. Runs compared with
each other are started alike."""


def run_env() -> dict[str, str]:
    """The environment of a `python -m locojax` child: this one's, with CHILD_XLA_FLAGS in
    place of the pytest process's 8-device flag."""
    return {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {
        "XLA_FLAGS": CHILD_XLA_FLAGS}


def _shared_root(factory: pytest.TempPathFactory) -> Path:
    """A directory every xdist worker of this session sees (the base temp's parent under
    xdist, where each worker's base temp is `popen-gw<i>`)."""
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    (root / "shared-runs").mkdir(exist_ok=True)
    return root / "shared-runs"


def shared(factory: pytest.TempPathFactory, name: str,
           make: Callable[[Path], tuple[bool, str]]) -> Path:
    """The run directory `make(run_dir)` trains, made by the first caller of the session (any
    worker) and reused by the rest; `make` returns (succeeded, what to show if not). Fails the
    same way for each if it failed. Keep what the tests read beside it (`output_of`)."""
    root = _shared_root(factory)
    run_dir, done, failed = root / name, root / f"{name}.done", root / f"{name}.failed"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists() and not failed.exists():
            ok, text = make(run_dir)
            (done if ok else failed).write_text(text)
    assert done.exists(), failed.read_text()
    return run_dir


def output_of(run_dir: Path, suffix: str = "") -> tuple[str, str]:
    """(stdout, stderr) of the shared run `run_dir`'s process (`suffix`: one of its hosts')."""
    return tuple((run_dir.parent / f"{run_dir.name}{suffix}.{s}").read_text()
                 for s in ("stdout", "stderr"))


def save_output(run_dir: Path, stdout: str, stderr: str, suffix: str = "") -> None:
    """Keeps a shared run's output beside it, for `output_of`."""
    for s, text in (("stdout", stdout), ("stderr", stderr)):
        (run_dir.parent / f"{run_dir.name}{suffix}.{s}").write_text(text)


def sockets_of(run_dir: Path) -> Path:
    """Where an `audit_sockets` run's processes wrote their starts and network sockets."""
    return run_dir.parent / f"{run_dir.name}.sockets"


def audit_sockets_env(run_dir: Path) -> dict[str, str]:
    """Variables under which every Python process of the run writes its start and each TCP
    or UDP socket it opens to `sockets_of(run_dir)` (tests/fixtures/socket_audit). The run
    starts as a subprocess, not forked warm (its PYTHONPATH differs)."""
    path = [str(FIXTURES / "socket_audit"), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(filter(None, path)),
            "LOCOJAX_SOCKET_AUDIT": str(sockets_of(run_dir))}


def shared_run(factory: pytest.TempPathFactory, name: str, *overrides: str,
               audit_sockets: bool = False) -> Path:
    """The run directory of `python -m locojax <overrides>` (`shared`); its whole stdout and
    stderr (a pipe, as under a batch system) are kept for `output_of`; `audit_sockets`: its
    processes' network sockets are written down (`audit_sockets_env`)."""
    def make(run_dir: Path) -> tuple[bool, str]:
        extra = audit_sockets_env(run_dir) if audit_sockets else {}
        out = warm.run([sys.executable, "-m", "locojax", *overrides,
                        f"hydra.run.dir={run_dir}"], capture_output=True, text=True,
                       timeout=900, cwd=ROOT, env=run_env() | extra)
        save_output(run_dir, out.stdout, out.stderr)
        return out.returncode == 0, out.stderr[-3000:]

    return shared(factory, name, make)


def copied(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of a shared run that a test may change."""
    return Path(shutil.copytree(run_dir, tmp_path / "run"))

"""Whether a command's processes load libtpu: a sitecustomize on the children's PYTHONPATH
records, as each Python process exits, whether libtpu is mapped into it.

    env, maps = recording(scratch, base_env)    the command's environment, the record's path
    <run the command with env>
    assert_none_loaded(maps, stderr, processes)  no process mapped it, none said TPU
"""

import os
from pathlib import Path

MAPS_REPORT = """import atexit, os
def _report():
    with open(os.environ["LOCOJAX_TEST_MAPS"], "a") as f:
        f.write(f"{os.getpid()} {'libtpu' in open('/proc/self/maps').read()}\\n")
atexit.register(_report)
"""
"""A sitecustomize that records, as each process exits, whether libtpu is mapped into it."""
TPU_WORDS = ("libtpu", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE", "Traceback")
"""What a CPU command's stderr never says (the test's tmp_path must not hold 'libtpu')."""


def site_dir(scratch: Path, text: str, name: str = "site") -> Path:
    """A folder under `scratch` holding `text` as its sitecustomize.py: put it first on a
    child's PYTHONPATH and every Python process of the child runs `text` at start."""
    site = scratch / name
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(text)
    return site


def recording(scratch: Path, env: dict[str, str]) -> tuple[dict[str, str], Path]:
    """`env` with the recording sitecustomize first on PYTHONPATH, and the record's path; both
    are written under `scratch` (not a run directory: a run refuses one that holds them)."""
    site = site_dir(scratch, MAPS_REPORT, "maps-site")
    maps = scratch / "maps.txt"
    path = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return env | {"PYTHONPATH": path, "LOCOJAX_TEST_MAPS": str(maps)}, maps


def assert_no_tpu_lines(stderr: str) -> None:
    """`stderr` says nothing of a TPU (`TPU_WORDS`)."""
    for word in TPU_WORDS:
        assert word not in stderr, stderr[-2000:]


def assert_none_loaded(maps: Path, stderr: str, processes: int) -> None:
    """At least `processes` Python processes exited, none with libtpu mapped, and `stderr`
    says nothing of a TPU."""
    assert_no_tpu_lines(stderr)
    loaded = maps.read_text().split()
    assert len(loaded) >= 2 * processes, loaded
    assert set(loaded[1::2]) == {"False"}, maps.read_text()

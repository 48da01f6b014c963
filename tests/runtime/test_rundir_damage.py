"""Issue 62, item 1: every file of a run directory that a resume reads, damaged five ways (empty,
cut in half, not JSON, JSON of the wrong shape, an object missing its keys): the resume's
readers, run as a resume runs them (layout, lock, record and plan, the newest step's meta,
provenance, the export marker, the metrics rows), say in one line which file and what they do
about it (skip, write again, or refuse with `RunDirError` / `ResumeRefused`: exit 2 at the
door), never a traceback. The same through `python -m locojax`: scripts/bad_inputs.py r62
cases and tests/e2e/test_user_errors.py."""

import json
from pathlib import Path

import pytest
from compiler_cases import make_config

from compiler import compile_plan
from locojax.launch.dispatch import finished
from locojax.runtime.errors import ResumeRefused, RunDirError
from locojax.runtime.observe.metrics import MetricsWriter, read_metrics
from locojax.runtime.rundir.files import (
    EXPORT_FILES,
    EXPORT_MARKER,
    LOCK_FILE,
    METRICS_FILE,
    PLAN_FILE,
    PROVENANCE_FILE,
    RECORD_FILE,
    write_plan,
)
from locojax.runtime.rundir.owner import RunDirLock, check_layout
from locojax.runtime.rundir.preflight import (
    ORBAX_META,
    _meta_on_disk,
    check_resume,
    check_step_meta,
    record,
    step_meta,
)
from locojax.runtime.rundir.provenance import provenance


def _plan(steps: int):
    return compile_plan(make_config(mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 1},
                                    overrides={"run": {"steps": steps}}))


PLAN = _plan(2)
META = str(Path("checkpoints", "2", *ORBAX_META))
DAMAGES = {
    "empty": lambda text: "",
    "cut": lambda text: text[:len(text) * 3 // 4],
    "not JSON": lambda text: "{oops",
    "wrong shape": lambda text: "[1, 2]",
    "no keys": lambda text: "{}",
}


def _run_dir(d: Path) -> Path:
    """A run of 2 steps as its directory holds it when it ended: plan, record, provenance,
    the checkpoint of step 2 (its meta), two metrics rows, the export, the released lock."""
    write_plan(PLAN, d)
    record(PLAN, d)
    provenance(PLAN, d)
    (d / META).parent.mkdir(parents=True)
    (d / META).write_text(json.dumps({"step": 2, **step_meta(PLAN)}))
    (d / METRICS_FILE).write_text("".join(json.dumps({"step": s, "loss": 0.5}) + "\n"
                                          for s in range(2)))
    (d / "hf").mkdir()
    for name in EXPORT_FILES:
        (d / "hf" / name).write_text("{}")
    (d / "hf" / EXPORT_MARKER).write_text(json.dumps({"step": 2}) + "\n")
    with RunDirLock(d):
        pass
    (d / LOCK_FILE).write_text(json.dumps({"pid": 12345, "host": "elsewhere",
                                           "token": "t", "heartbeat": 0.0}))
    return d


def _resume(d: Path, steps: int = 2) -> list[str]:
    """The reads of a resume in `d` to `steps` steps, as `python -m locojax` makes them
    (without the model); the warning lines they said."""
    said: list[str] = []
    plan = _plan(steps)
    check_layout(d)
    with RunDirLock(d):
        check_resume(plan, d, said.append)
        meta = _meta_on_disk(d / "checkpoints" / "2")
        if meta is not None:
            check_step_meta(plan, 2, d / "checkpoints" / "2", meta)
        if not finished(plan, d):
            provenance(plan, d)
            with MetricsWriter(d, plan=None) as writer:
                writer.truncate_from(2, warn=said.append)
    return said


def test_an_undamaged_directory_resumes_without_a_word(tmp_path, capsys):
    assert _resume(_run_dir(tmp_path), steps=3) == []
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("name,outcome", [
    (METRICS_FILE, "skipped"),
    (PLAN_FILE, "written again"),
    (RECORD_FILE, "written again"),
    (LOCK_FILE, "written again"),
    (f"hf/{EXPORT_MARKER}", "written again"),
    (PROVENANCE_FILE, "refused"),
    (META, "restore"),
])
def test_each_file_damaged_is_one_line_naming_it(tmp_path, capsys, name, outcome, damage):
    d = _run_dir(tmp_path)
    path = d / name
    path.write_text(DAMAGES[damage](path.read_text()))
    steps = 2 if name == f"hf/{EXPORT_MARKER}" else 3
    said, refused = [], ""
    try:
        said = _resume(d, steps)
    except (RunDirError, ResumeRefused) as err:
        refused = str(err)
    lines = [*said, *capsys.readouterr().err.splitlines(), *filter(None, [refused])]
    if outcome == "restore" and damage != "no keys" or damage == "empty" and name in (
            METRICS_FILE, LOCK_FILE):
        # a meta that does not read is the restore's to judge (it falls back to the step
        # before); an empty metrics file holds no row, an empty lock is a released one
        assert lines == [] and refused == ""
        return
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert str(path) in lines[0] or (name == META and str(d / "checkpoints" / "2") in lines[0])
    if outcome == "refused" or name == META:
        assert refused, lines
    else:
        assert not refused and outcome in lines[0], lines[0]


def test_a_last_metrics_row_of_braces_is_skipped_and_the_rows_before_kept(tmp_path):
    """The second round's open fault: a last line `{}` ended the resume in KeyError 'step'."""
    d = _run_dir(tmp_path)
    with open(d / METRICS_FILE, "a") as f:
        f.write("{}\n")
    said = _resume(d, steps=3)
    assert len(said) == 1 and f"{d / METRICS_FILE}: line 3 is not a metrics row" in said[0]
    assert [r["step"] for r in read_metrics(d / METRICS_FILE)] == [0, 1]
    assert (d / METRICS_FILE).read_text().count("\n") == 2


@pytest.mark.parametrize("line", [b'{"step": true}', b'{"step": "1"}', b'{"step": -1}',
                                  b"\xff\xfe", b"7", b'[{"step": 1}]', b"[" * 10_000],
                         ids=["bool", "str", "negative", "utf8", "number", "list", "deep"])
def test_lines_that_are_no_row_are_skipped(tmp_path, line):
    (tmp_path / METRICS_FILE).write_bytes(b'{"step": 0}\n' + line + b'\n{"step": 1}\n')
    assert [r["step"] for r in read_metrics(tmp_path / METRICS_FILE)] == [0, 1]


@pytest.mark.parametrize("lease", [{"pid": -1, "host": "h"}, {"pid": 0, "host": "h"},
                                   {"pid": 10 ** 30, "host": "h"}, {"pid": True, "host": "h"},
                                   {"pid": 5, "host": 7}, {"pid": "5", "host": "h"}])
def test_a_lease_of_no_pid_or_host_is_taken_over(tmp_path, capsys, lease):
    (tmp_path / LOCK_FILE).write_text(json.dumps(lease))
    with RunDirLock(tmp_path):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] > 0
    assert "holds no lease a run wrote" in capsys.readouterr().err

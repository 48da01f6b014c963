"""The run directory is owned and checked, and its record trusted only when valid, without a
run: the lock (a second holder refused naming pid and host, in process and from another
process), a foreign directory (Hydra's own output does not count; run.reuse_dir lets it be),
every layout entry of the wrong type or looping, a record that is null, mistyped or unparseable
(plan.json stands in; neither: refused), each checkpoint step's fingerprint and format, and
step names of ASCII digits only. The same through the door: tests/e2e/test_user_errors.py."""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from compiler_cases import make_config

from compiler import compile_plan
from locojax.runtime.errors import ResumeRefused, RunDirError
from locojax.runtime.rundir import owner
from locojax.runtime.rundir.files import (
    LOCK_FILE,
    PLAN_FILE,
    PROBE_PREFIX,
    RECORD_FILE,
    write_plan,
)
from locojax.runtime.rundir.owner import RunDirLock, check_layout, check_ours
from locojax.runtime.rundir.preflight import (
    CHECKPOINT_FORMAT,
    check_resume,
    check_step_meta,
    checkpoint_steps,
    config_fingerprint,
    record,
    step_meta,
)

PLAN = compile_plan(make_config(mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 1}))


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    with RunDirLock(tmp_path):
        held = json.loads((tmp_path / LOCK_FILE).read_text())
        assert (held["pid"], held["host"]) == (os.getpid(), socket.gethostname())
        with pytest.raises(RunDirError, match=rf"hydra.run.dir={tmp_path}: another run is "
                                              rf"using it \(pid {os.getpid()} on host "):
            RunDirLock(tmp_path).acquire()
    with RunDirLock(tmp_path):  # released: the next run may have it
        pass


def test_a_symlinked_or_special_lock_is_refused_and_its_target_untouched(tmp_path):
    """Issue 41, item 3: the holder's line was written through a symbolic link into its
    target (truncated first); a link, or a lock that is no regular file, is one line."""
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_FILE).symlink_to(target)
    with pytest.raises(RunDirError, match=r"\.locojax\.lock: a symbolic link \(to .*precious"
                                          r"\.txt\); a run's lock is a file of its own"):
        RunDirLock(run_dir).acquire()
    assert target.read_text() == "keep me\n"
    (run_dir / LOCK_FILE).unlink()
    os.mkfifo(run_dir / LOCK_FILE)
    with pytest.raises(RunDirError, match=r"\.locojax\.lock: not a regular file"):
        RunDirLock(run_dir).acquire()
    (run_dir / LOCK_FILE).unlink()
    with RunDirLock(run_dir):  # its own file again: taken
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_write_atomic_replaces_whole_never_through_a_link_and_leaves_no_temp(tmp_path):
    """Issue 41, item 3: the run's own files (plan, record, provenance, tracker ids, the
    metrics rewrite) are written under a temp name of the writer's own, synced, renamed."""
    from locojax.runtime.rundir.files import write_atomic

    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    path = tmp_path / "plan.json"
    path.symlink_to(target)
    write_atomic(path, "{}\n")
    assert not path.is_symlink() and path.read_text() == "{}\n"
    assert target.read_text() == "keep me\n"
    umask = os.umask(0o022)
    try:
        write_atomic(path, "[]\n")
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644
    (tmp_path / "a_dir").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path / "a_dir", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_dir", "plan.json", "precious.txt"]


def test_another_process_holding_the_lock_is_named_and_its_end_frees_it(tmp_path):
    code = ("import sys, time; from locojax.runtime.rundir.owner import RunDirLock; "
            f"RunDirLock({str(tmp_path)!r}).acquire(); print('held', flush=True); "
            "sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(RunDirError, match=rf"\(pid {holder.pid} on host "):
            RunDirLock(tmp_path).acquire()
    finally:
        holder.communicate("", timeout=60)  # it ends: the kernel drops its lock
    RunDirLock(tmp_path).acquire().release()


NO_FLOCK = "import fcntl; fcntl.flock = lambda *a: None; "
"""A filesystem whose flock succeeds and excludes no one (gcsfuse, NFS `nolock`)."""


def test_without_a_working_flock_the_lease_refuses_a_second_run(tmp_path, monkeypatch):
    """Two processes share a directory whose flock stops neither: the lease names the live
    holder; once its process ends (without releasing), its lease is stale and taken."""
    code = (NO_FLOCK + "import sys; from locojax.runtime.rundir.owner import RunDirLock; "
            f"RunDirLock({str(tmp_path)!r}).acquire(); print('held', flush=True); "
            "sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    monkeypatch.setattr(owner.fcntl, "flock", lambda *a: None)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(RunDirError, match=rf"\(pid {holder.pid} on host .*\) \(this "
                                              r"filesystem's flock did not stop it\)"):
            RunDirLock(tmp_path).acquire()
    finally:
        holder.communicate("", timeout=60)
    lock = RunDirLock(tmp_path).acquire()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


@pytest.mark.parametrize("age_s, taken", [(owner.LEASE_TTL_S + 5, True), (1.0, False)])
def test_another_hosts_lease_holds_until_its_heartbeat_is_stale(tmp_path, monkeypatch,
                                                                 age_s, taken):
    monkeypatch.setattr(owner.fcntl, "flock", lambda *a: None)
    (tmp_path / LOCK_FILE).write_text(json.dumps(
        {"pid": 1, "host": "another-node", "token": "t", "heartbeat": time.time() - age_s}))
    if taken:
        RunDirLock(tmp_path).acquire().release()
    else:
        with pytest.raises(RunDirError, match=r"\(pid 1 on host another-node\) \(this .*\); its lease was "
                                              r"renewed 1 s ago: if that run is gone, it "
                                              r"lapses in 29 s; wait for it"):
            RunDirLock(tmp_path).acquire()


def test_a_holder_whose_lease_was_taken_over_stops_in_one_line(tmp_path):
    """The holder's heartbeat finds another run's token: it exits 2 at once, one line."""
    code = (NO_FLOCK + "import time; from locojax.runtime.rundir import owner; "
            "owner.LEASE_BEAT_S = 0.1; "
            f"owner.RunDirLock({str(tmp_path)!r}).acquire(); print('held', flush=True); "
            "time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    (tmp_path / LOCK_FILE).write_text(json.dumps(
        {"pid": 1, "host": "another-node", "token": "theirs", "heartbeat": time.time()}))
    _, err = holder.communicate(timeout=60)  # a hang guard: it ends at its next beat
    assert holder.returncode == 2 and err.strip().count("\n") == 0, err
    assert err.startswith(f"error: hydra.run.dir={tmp_path}: another run took it over "
                          "(pid 1 on host another-node)"), err
    assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == "theirs"


def test_a_foreign_directory_is_refused_unless_reused(tmp_path):
    (tmp_path / "passwd").write_text("root:x:0:0\n")
    (tmp_path / "hosts").write_text("127.0.0.1 localhost\n")
    (tmp_path / ".hydra").mkdir()  # Hydra wrote these before our code ran
    (tmp_path / "__main__.log").write_text("")
    with pytest.raises(RunDirError, match=r"not empty and not a LoCoJAX run directory \(it "
                                          r"holds hosts, passwd\); .*run.reuse_dir=true"):
        check_ours(tmp_path, reuse=False)
    check_ours(tmp_path, reuse=True)


@pytest.mark.parametrize("names", [[], [".hydra", "__main__.log", ".hydra-host1"],
                                   [".hydra-host1", f"{PROBE_PREFIX}4242"],
                                   [LOCK_FILE, "notes.txt"], [PLAN_FILE, "metrics.jsonl"]])
def test_an_empty_hydra_only_or_marked_directory_is_ours(tmp_path, names):
    """Another host of the same run may be between writing and removing its write probe when
    this host looks (the two-host e2e met it)."""
    for name in names:
        (tmp_path / name).mkdir() if name.startswith(".hydra") else (tmp_path / name).touch()
    check_ours(tmp_path, reuse=False)


@pytest.mark.parametrize("damage,name,says", [
    (lambda d: (d / "metrics.jsonl").mkdir(), "metrics.jsonl", "a directory, where the run "
                                                                "keeps a file"),
    (lambda d: (d / "plan.json").mkdir(), "plan.json", "a directory, where the run keeps a file"),
    (lambda d: (d / "checkpoints").symlink_to(d / "checkpoints"), "checkpoints",
     "a symbolic link that loops"),
    (lambda d: (d / "checkpoints").write_text("x"), "checkpoints",
     "a file, where the run keeps a directory"),
    (lambda d: (d / "hf").symlink_to(d / "gone"), "hf", "a symbolic link to nothing"),
    (lambda d: ((d / "hf").mkdir(), (d / "hf" / "config.json").mkdir()), "hf/config.json",
     "a directory, where the run keeps a file"),
    (lambda d: ((d / "checkpoints").mkdir(), (d / "checkpoints" / "4").write_text("x")),
     "checkpoints/4", "a file, where the run keeps a directory"),
    (lambda d: os.mkfifo(d / "resolved_config.json"), "resolved_config.json",
     "neither file nor directory"),
    # A file the run writes, linked elsewhere: the run would write into the link's target.
    (lambda d: ((d / "elsewhere").write_text("x"), (d / "metrics.jsonl").symlink_to(
        d / "elsewhere")), "metrics.jsonl", "a symbolic link (to "),
    (lambda d: ((d / "hf").mkdir(), (d / "hf" / "config.json").symlink_to(d / "gone")),
     "hf/config.json", "a symbolic link (to "),
])
def test_each_layout_entry_of_the_wrong_type_is_one_line(tmp_path, damage, name, says):
    damage(tmp_path)
    with pytest.raises(RunDirError) as err:
        check_layout(tmp_path)
    line = str(err.value)
    assert line.startswith(f"{tmp_path / name}: {says}") and "\n" not in line, line


def test_a_well_formed_run_directory_passes(tmp_path):
    write_plan(PLAN, tmp_path)
    record(PLAN, tmp_path)
    for sub in ("checkpoints/2", "checkpoints/4.orbax-checkpoint-tmp-7", "hf", "tb"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "metrics.jsonl").write_text("")
    check_ours(tmp_path, reuse=False)
    check_layout(tmp_path)


@pytest.mark.parametrize("text", ["null", "42", "[1, 2]", "{not json", "", '{"run.steps": 3}',
                                  '{"run.seed": {"a": 1}, "run.steps": 3}'])
def test_a_damaged_record_falls_back_to_plan_json(tmp_path, text):
    write_plan(PLAN, tmp_path)
    (tmp_path / RECORD_FILE).write_text(text)
    told = []
    other = dataclasses.replace(PLAN, run=dataclasses.replace(PLAN.run, seed=7))
    with pytest.raises(ResumeRefused, match=r"run.seed=0 there, 7 now"):
        check_resume(other, tmp_path, told.append)
    assert told == []  # a refusal is its one line
    check_resume(PLAN, tmp_path, told.append)  # the same configuration resumes, told so
    assert len(told) == 1 and told[0].startswith(f"warning: {tmp_path / RECORD_FILE}: ")
    record(PLAN, tmp_path)  # and the record is written again
    assert json.loads((tmp_path / RECORD_FILE).read_text())["run.seed"] == 0


@pytest.mark.parametrize("record_text,plan_text", [("null", None), ("42", "[]"),
                                                   (None, "{broken"), (None, None)])
def test_neither_record_nor_plan_readable_refuses_the_resume(tmp_path, record_text, plan_text):
    for name, text in ((RECORD_FILE, record_text), (PLAN_FILE, plan_text)):
        if text is not None:
            (tmp_path / name).write_text(text)
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)
    with pytest.raises(ResumeRefused, match=rf"{tmp_path}: what configuration made it is "
                                            r"unknown \(resolved_config.json: .*; plan.json: "):
        check_resume(PLAN, tmp_path)


def test_a_fresh_directory_needs_no_record(tmp_path):
    check_resume(PLAN, tmp_path)


def test_step_meta_carries_format_and_fingerprint():
    meta = {"step": 3, **step_meta(PLAN)}
    assert meta["format"] == CHECKPOINT_FORMAT and meta["config_fingerprint"] == \
        config_fingerprint(PLAN)
    check_step_meta(PLAN, 3, Path("/r/checkpoints/3"), meta)
    longer = dataclasses.replace(PLAN, run=dataclasses.replace(PLAN.run, steps=900))
    check_step_meta(longer, 3, Path("/r/checkpoints/3"), meta)  # run.steps may change
    older = {**meta, "config_fingerprint": "0" * 16,
             "config": {**meta["config"], "model.gone_key": 1}}
    check_step_meta(PLAN, 3, Path("/r/checkpoints/3"), older)  # another version's key only


@pytest.mark.parametrize("change,says", [
    ({"format": 99}, "checkpoint format 99, this LoCoJAX reads format 1"),
    ({"format": None}, "checkpoint format absent"),
    ({"step": 999}, "its metadata says step 999, its directory step 3"),
    ({"config_fingerprint": "f" * 16, "config": None}, "its configuration is not recorded"),
])
def test_a_step_of_another_format_step_or_configuration_is_refused(change, says):
    meta = {"step": 3, **step_meta(PLAN), **change}
    with pytest.raises(ResumeRefused, match=f"/r/checkpoints/3: .*{says}"):
        check_step_meta(PLAN, 3, Path("/r/checkpoints/3"), meta)


def test_a_step_written_by_another_seed_is_refused_naming_it():
    other = dataclasses.replace(PLAN, run=dataclasses.replace(PLAN.run, seed=5))
    meta = {"step": 3, **step_meta(other)}
    with pytest.raises(ResumeRefused, match=r"written by another configuration \(fingerprint "
                                            r"[0-9a-f]{16}, this run's [0-9a-f]{16}: run.seed=5 "
                                            r"there, 0 now\)"):
        check_step_meta(PLAN, 3, Path("/r/checkpoints/3"), meta)


def test_step_names_are_ascii_digits(tmp_path):
    for name in ("2", "10", "²", "٣", "4.orbax-checkpoint-tmp-1", "x"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert checkpoint_steps(tmp_path) == [2, 10]


def test_the_newest_steps_meta_on_disk_is_checked_before_plan_json_is_written(tmp_path):
    write_plan(PLAN, tmp_path)
    record(PLAN, tmp_path)
    for step, fmt in ((2, CHECKPOINT_FORMAT), (4, 99)):
        meta = tmp_path / "checkpoints" / str(step) / "meta" / "metadata"
        meta.parent.mkdir(parents=True)
        meta.write_text(json.dumps({"step": step, **step_meta(PLAN), "format": fmt}))
    with pytest.raises(ResumeRefused, match=r"checkpoints/4: checkpoint format 99"):
        check_resume(PLAN, tmp_path)
    (tmp_path / "checkpoints" / "4" / "meta" / "metadata").write_text("{torn")
    check_resume(PLAN, tmp_path)  # unreadable: the restore's fall-back judges that step

"""The run directory checks and the resume record, without a run."""

import errno
import json
import os
import shutil

import pytest
from compiler_cases import make_config
from paths import FIXTURES

from compiler import compile_plan
from locojax.config.compose import compose_config
from locojax.runtime.errors import ResumeRefused, RunDirError
from locojax.runtime.rundir.files import RECORD_FILE
from locojax.runtime.rundir.preflight import (
    check_resume,
    check_run_dir,
    checkpoint_bytes,
    disk_full,
    record,
)

PLAN = compile_plan(make_config(mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 1}))


def test_room_for_one_checkpoint_by_the_plans_estimate(tmp_path):
    need = checkpoint_bytes(PLAN)
    assert need == PLAN.model.param_count * PLAN.sharding.train_state_bytes_per_param + \
        PLAN.model.param_bytes
    check_run_dir(tmp_path / "new", need)
    assert (tmp_path / "new").is_dir() and list((tmp_path / "new").iterdir()) == []
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(RunDirError, match=r"hydra.run.dir=.*free, one checkpoint and the HF "
                                          r"export need about"):
        check_run_dir(tmp_path, free * 2)


def test_not_a_directory(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(RunDirError, match="cannot create it"):
        check_run_dir(tmp_path / "afile" / "sub", 1)
    with pytest.raises(RunDirError, match="not a directory"):
        check_run_dir(tmp_path / "afile", 1)


def test_a_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    """Issue 41, item 3: the run directory's owner must be the user running it."""
    run_dir = tmp_path / "theirs"
    run_dir.mkdir()
    check_run_dir(run_dir, 1)
    mine = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: mine + 1)  # as another user sees it
    with pytest.raises(RunDirError, match=rf"hydra.run.dir=.*theirs: owned by uid {mine}, not "
                                          rf"by this user \(uid {mine + 1}\)"):
        check_run_dir(run_dir, 1)
    monkeypatch.undo()
    check_run_dir(tmp_path / "new", 1)  # one it creates is its own
    assert (tmp_path / "new").stat().st_uid == mine


@pytest.mark.parametrize("text", [
    "Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: \"No space "
    "left on device\" })",  # safetensors (Rust io::Error)
    "INTERNAL: Error writing local file \"/r/x\": [OS error 28: No space left on device]",
    "Disk quota exceeded (os error 122)"])
def test_a_library_that_says_disk_full_in_words_is_disk_full(text):
    """tensorstore, safetensors and tokenizers raise no OSError: their text is read."""
    try:
        try:
            raise RuntimeError(text)
        except RuntimeError as e:
            raise ValueError("checkpoint failed") from e
    except ValueError as outer:
        found = disk_full(outer)
    assert found is not None and found.errno == errno.ENOSPC and found.filename is None
    assert disk_full(RuntimeError("os error 2: No such file or directory")) is None


def test_disk_full_is_found_behind_wrappers():
    import errno

    inner = OSError(errno.ENOSPC, "No space left on device", "/x")
    outer = ValueError("save failed")
    outer.__cause__ = inner
    assert disk_full(outer) is inner and disk_full(ValueError("other")) is None


def test_record_is_written_once_and_a_changed_config_is_refused(tmp_path):
    check_resume(PLAN, tmp_path)  # nothing recorded: anything goes
    record(PLAN, tmp_path)
    first = (tmp_path / RECORD_FILE).read_text()
    check_resume(PLAN, tmp_path)
    import dataclasses

    longer = dataclasses.replace(PLAN, run=dataclasses.replace(PLAN.run, steps=500))
    check_resume(longer, tmp_path)  # run.steps may change
    other = dataclasses.replace(PLAN, algorithm=dataclasses.replace(PLAN.algorithm,
                                                                     learning_rate=0.5))
    with pytest.raises(ResumeRefused, match=r"algorithm.learning_rate=1e-06 there, 0.5 now"):
        check_resume(other, tmp_path)
    record(other, tmp_path)
    assert (tmp_path / RECORD_FILE).read_text() == first


def test_an_added_or_removed_reward_function_or_data_file_is_refused(tmp_path):
    """Issue 41: a key one record holds and the other does not is a change when the user adds
    or removes it (an entry of reward_fns, reward_weights, data_files, a file's digest); a
    setting only the older record lacks came with another code version and is accepted."""
    import dataclasses

    (tmp_path / "r.py").write_text("def a(completions, **kw):\n    return [1.0]\n")
    (tmp_path / "eval.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')

    def plan(fns, files):
        w = dataclasses.replace(PLAN.workload, reward_fns=fns, data_files=files,
                                reward_weights={k: 1.0 for k in fns})
        return dataclasses.replace(PLAN, workload=w)

    one = {"a": f"{tmp_path / 'r.py'}:a"}
    run = tmp_path / "run"
    run.mkdir()
    record(plan(one, {"eval": str(tmp_path / "eval.jsonl")}), run)
    check_resume(plan(one, {"eval": str(tmp_path / "eval.jsonl")}), run)
    two = one | {"b": f"{tmp_path / 'r.py'}:a"}
    with pytest.raises(ResumeRefused, match=r"workload.reward_fns.b=\(absent\) there, '"):
        check_resume(plan(two, {"eval": str(tmp_path / "eval.jsonl")}), run)
    with pytest.raises(ResumeRefused, match=r"workload.data_files.eval='.*eval.jsonl' there, "
                                            r"\(absent\) now"):
        check_resume(plan(one, {}), run)
    (tmp_path / "eval.jsonl").write_text('{"prompt": "1+2", "answer": "3"}\n')
    with pytest.raises(ResumeRefused, match=r"workload.data_file_sha256.eval="):
        check_resume(plan(one, {"eval": str(tmp_path / "eval.jsonl")}), run)
    # A setting the record lacks (an older version wrote it) is not a change.
    (tmp_path / "eval.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    recorded = json.loads((run / RECORD_FILE).read_text())
    del recorded["algorithm.learning_rate"]
    (run / RECORD_FILE).write_text(json.dumps(recorded))
    check_resume(plan(one, {"eval": str(tmp_path / "eval.jsonl")}), run)


def test_a_checkpoint_past_run_steps_is_refused(tmp_path):
    (tmp_path / "checkpoints" / "150").mkdir(parents=True)
    (tmp_path / "checkpoints" / "200.orbax-checkpoint-tmp-1").mkdir()
    with pytest.raises(ResumeRefused, match="run.steps=100: .* already holds the checkpoint of "
                                            "step 150"):
        check_resume(PLAN, tmp_path)


def test_a_checkpoints_own_tokenizer_is_part_of_the_record(tmp_path):
    """Issue 41: a changed tokenizer is a change. A checkpoint's tokenizer files are digested
    into the record (and the hosts' agreement); the built-in tokenizers are not."""
    from locojax.runtime.rundir.preflight import record_of, tokenizer_digest
    from locojax.tokenizers import save_checkpoint_tokenizer
    from locojax.tokenizers.char import load_char

    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "tiny_qwen3", ckpt)

    def plan(*extra):
        return compile_plan(compose_config(["+experiment=arith_co", "mesh=cpu", "model=hf",
                                            f"model.checkpoint={ckpt}", *extra]))

    assert tokenizer_digest(plan("model.tokenizer=char")) == {}  # no tokenizer.json there
    save_checkpoint_tokenizer(load_char(), ckpt)
    first = record_of(plan("model.tokenizer=checkpoint"))["model.tokenizer_sha256"]
    assert tokenizer_digest(plan("model.tokenizer=qwen")) == {"model.tokenizer_sha256": first}
    assert tokenizer_digest(plan()) == {}  # arith_co's char is the package's
    config = json.loads((ckpt / "tokenizer_config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(json.dumps(config | {"eos_token": "<pad>"}))
    assert record_of(plan("model.tokenizer=checkpoint"))["model.tokenizer_sha256"] != first
    assert "model.tokenizer_sha256" not in record_of(PLAN)

"""The files a run reads, by content: in the run's record (a resume with other contents is
refused) and agreed by its hosts before the first step (`launch.agree.agree_files`)."""

import json

import pytest

from compiler import compile_plan
from locojax.config.compose import compose_config
from locojax.launch import agree
from locojax.runtime.errors import JobError
from locojax.runtime.rundir.preflight import file_digests, record_of


def _plan(tmp_path, data: str):
    (tmp_path / "train.jsonl").write_text(data)
    (tmp_path / "fns.py").write_text("def f(completions, **kw):\n    return [0.0] * len("
                                     "completions)\n")
    return compile_plan(compose_config([
        "+experiment=arith_co", "workload=custom",
        f"+workload.data_files.train={tmp_path / 'train.jsonl'}",
        f"+workload.reward_fns.f={tmp_path / 'fns.py'}:f",
        "+workload.tools.calc=locojax.envs.calculator:calculate", "workload.max_turns=2"]))


def test_the_record_holds_each_files_contents(tmp_path):
    plan = _plan(tmp_path, '{"question": "1+1", "answer": "2"}\n')
    digests = file_digests(plan)
    assert set(digests) == {"workload.reward_fn_sha256.f", "workload.tool_sha256.calc",
                            "workload.data_file_sha256.train"}
    assert all(len(v) == 64 for v in digests.values()), digests
    assert digests.items() <= record_of(plan).items()
    changed = file_digests(_plan(tmp_path, '{"question": "1+2", "answer": "3"}\n'))
    assert changed["workload.data_file_sha256.train"] != digests["workload.data_file_sha256.train"]
    (tmp_path / "train.jsonl").unlink()
    assert file_digests(plan)["workload.data_file_sha256.train"] == "missing"


def test_hosts_with_other_copies_stop_naming_the_file(tmp_path, monkeypatch):
    # Host 1's copy of the data file differs: what its gathered digests would say.
    plan = _plan(tmp_path, '{"question": "1+1", "answer": "2"}\n')
    mine = file_digests(plan)
    theirs = mine | {"workload.data_file_sha256.train": "0" * 64}

    def two_hosts(name, text, timeout_s):
        other = (agree._digest(theirs) if name.endswith("digest") else json.dumps(theirs))
        return [text, other]

    monkeypatch.setattr(agree, "all_gather_text", two_hosts)
    with pytest.raises(JobError) as err:
        agree.agree_files(plan, timeout_s=5)
    line = str(err.value)
    assert line.startswith("the hosts hold different copies of the run's files (sha256): "
                           "workload.data_file_sha256.train is ")
    assert "on host 1" in line and "reward_fn" not in line and "\n" not in line
    monkeypatch.setattr(agree, "all_gather_text", lambda name, text, t: [text, text])
    agree.agree_files(plan, timeout_s=5)  # the same copies: no line

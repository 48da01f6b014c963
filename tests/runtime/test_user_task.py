"""Reward functions and data files of the user's: the scorer's contract (weighted sum, None
counted, a raise or a timeout scores 0 with one warning line, a wrong length or a non-finite
value is one line naming the function) and `workload.data_files` (JSONL, Parquet, CSV,
eval_fraction, a missing field named with file, row and field)."""

import json
import logging

import pytest

from compiler.vocab import RewardKind
from locojax.data import DataError, WorkloadSettings, load_workload
from locojax.rewards import RewardFnError, RewardSettings, Scorer, fn_digest

FNS = '''
import time

def first(prompts, completions, target, **columns):
    return [1.0 if c == t else 0.0 for c, t in zip(completions, target)]

def maybe(prompts, completions, target, **columns):
    return [None if t == "skip" else 0.5 for t in target]

def raises(prompts, completions, **columns):
    if "boom" in completions:
        raise ValueError("boom on this row\\nsecond line")
    return [1.0] * len(completions)

def sleeps(prompts, completions, **columns):
    time.sleep(5)
    return [1.0] * len(completions)

def short(prompts, completions, **columns):
    return [1.0]

def nan(prompts, completions, **columns):
    return [float("nan")] * len(completions)
'''


def _scorer(tmp_path, *names, weights=None, timeout=2.0):
    path = tmp_path / "fns.py"
    path.write_text(FNS)
    fns = {n: f"{path}:{n}" for n in names}
    return Scorer(RewardSettings(kind=RewardKind.python, timeout_s=timeout, reward_fns=fns,
                                 reward_weights=weights or {}))


def _score(scorer, completions, targets):
    return scorer.score_batch(completions, [""] * len(completions), ["p"] * len(completions),
                              [{"target": t} for t in targets],
                              [f"t/train/{i}" for i in range(len(completions))])


def test_weighted_sum_and_per_function_sums(tmp_path):
    with _scorer(tmp_path, "first", "maybe", weights={"maybe": 2.0}) as s:
        r = _score(s, ["ab", "x", "c"], ["ab", "y", "skip"])
    assert r.rewards_B.tolist() == [2.0, 1.0, 0.0]
    assert r.fn_sums == {"first": 1.0, "maybe": 1.0}
    assert r.fn_counts == {"first": 3, "maybe": 2}  # None: not applicable, counted apart
    assert r.fn_failed == {"first": 0, "maybe": 0}


def test_a_raise_and_a_timeout_score_zero_with_one_warning_line_each(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    with _scorer(tmp_path, "raises", "sleeps", "first", timeout=1.0) as s:
        r = _score(s, ["boom", "ab"], ["x", "ab"])
        again = _score(s, ["ok", "ab"], ["x", "ab"])  # the worker restarts after a timeout
    assert r.rewards_B.tolist() == [0.0, 1.0] and r.fn_failed == {"raises": 2, "sleeps": 2,
                                                                   "first": 0}
    assert r.errors == 1 and r.timeouts == 1
    assert again.fn_failed["raises"] == 0 and again.fn_failed["sleeps"] == 2
    lines = [rec.getMessage() for rec in caplog.records if "reward function" in rec.getMessage()]
    assert any("raises: error" in x and "t/train/0" in x and "ValueError: boom on this row" in x
               and "second line" not in x for x in lines)
    assert any("sleeps: timeout" in x for x in lines)
    assert all("\n" not in x and "Traceback" not in x for x in lines)


@pytest.mark.parametrize(("name", "said"), [("short", "returned 1 values for 2"),
                                            ("nan", "finite")])
def test_a_broken_contract_is_one_line_naming_the_function(tmp_path, name, said):
    with _scorer(tmp_path, name) as s, pytest.raises(RewardFnError) as err:
        _score(s, ["a", "b"], ["a", "b"])
    assert name in str(err.value) and said in str(err.value) and "\n" not in str(err.value)


def test_a_bad_spec_fails_at_once(tmp_path):
    with pytest.raises(RewardFnError, match="no function 'nope'"):
        _scorer(tmp_path, "nope")
    with pytest.raises(RewardFnError, match="<path/to/file.py>:<function>"):
        Scorer(RewardSettings(kind=RewardKind.python, reward_fns={"a": "no_colon"}))


def test_the_file_digest_follows_the_file(tmp_path):
    path = tmp_path / "fns.py"
    path.write_text(FNS)
    before = fn_digest(f"{path}:first")
    path.write_text(FNS + "\n# changed\n")
    assert fn_digest(f"{path}:first") != before


def _rows(n):
    return [{"question": f"Q: {i}", "target": str(i)[::-1], "n": i} for i in range(n)]


def _settings(**given):
    return WorkloadSettings(**({"name": "custom", "reward": RewardKind.python} | given))


def test_jsonl_parquet_and_csv_give_the_same_problems_with_their_columns(tmp_path):
    import pandas as pd

    rows = _rows(40)
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame(rows).to_parquet(tmp_path / "t.parquet")
    pd.DataFrame(rows).to_csv(tmp_path / "t.csv", index=False)
    got = {}
    for ext in ("jsonl", "parquet", "csv"):
        w = load_workload(_settings(data_files={"train": str(tmp_path / f"t.{ext}")}), 0)
        got[ext] = [(p.question, p.columns["target"]) for p in w.train]
        assert w.train[3].columns["n"] == 3 and w.train[3].uid == "custom/train/3"
    assert got["jsonl"] == got["parquet"]
    assert [q for q, _ in got["csv"]] == [q for q, _ in got["jsonl"]]


def test_eval_fraction_holds_out_the_same_rows_every_time(tmp_path):
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(200)))
    s = _settings(data_files={"train": str(tmp_path / "t.jsonl")}, eval_fraction=0.25)
    a, b = load_workload(s, 0), load_workload(s, 1)
    assert [p.uid for p in a.eval] == [p.uid for p in b.eval]
    assert 25 <= len(a.eval) <= 75 and len(a.train) + len(a.eval) == 200
    assert not {p.uid for p in a.eval} & {p.uid for p in a.train}


def test_bad_rows_are_counted_and_a_missing_field_is_named(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"question": "Q: 1", "target": "1"}) + "\nnot json\n"
                    + json.dumps({"question": "", "target": "2"}) + "\n")
    w = load_workload(_settings(data_files={"train": str(path)}), 0)
    assert len(w.train) == 1 and w.skipped == 2
    with pytest.raises(DataError) as err:
        load_workload(_settings(data_files={"train": str(path)}, question_field="prompt"), 0)
    assert str(path) in str(err.value) and "row 1" in str(err.value)
    assert "'prompt'" in str(err.value)

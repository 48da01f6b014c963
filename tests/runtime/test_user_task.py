"""Reward functions and data files of the user's: the scorer's contract (weighted sum, None
counted, an isolated raise or timeout scores 0 with one warning line, a function failing on
every row of a batch or in consecutive steps stops in one line, a wrong length or a
non-finite value is one line naming the function) and `workload.data_files` (JSONL, Parquet, CSV,
eval_fraction, a missing field named with file, row and field)."""

import hashlib
import json
import sys

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

def slow_on_zz(prompts, completions, **columns):
    if "zz" in completions:
        time.sleep(5)
    return [1.0] * len(completions)

def short(prompts, completions, **columns):
    return [1.0]

def nan(prompts, completions, **columns):
    return [float("nan")] * len(completions)

def scalar(prompts, completions, **columns):
    return 1.0

def text(prompts, completions, **columns):
    return "ab"

def huge(prompts, completions, **columns):
    return [1e39] * len(completions)

class Sly:
    def __float__(self):
        import os
        return float(os.getpid())

def sly(prompts, completions, **columns):
    return [Sly() for _ in completions]
'''


def _scorer(tmp_path, *names, weights=None, timeout=2.0, workers=1, max_fail_steps=3):
    path = tmp_path / "fns.py"
    path.write_text(FNS)
    fns = {n: f"{path}:{n}" for n in names}
    return Scorer(RewardSettings(kind=RewardKind.python, timeout_s=timeout, reward_fns=fns,
                                 reward_weights=weights or {},
                                 reward_max_fail_steps=max_fail_steps), workers=workers)


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


def test_isolated_failures_score_zero_with_one_warning_line_each(tmp_path):
    """Two workers, two chunks: a raise or a timeout in one chunk scores its rows 0, is
    counted and tallied for the step's one line, and the batch's other rows keep their
    scores."""
    with _scorer(tmp_path, "raises", "slow_on_zz", "first", timeout=1.0, workers=2) as s:
        r = _score(s, ["boom", "ab", "ok", "ab"], ["x", "ab", "x", "ab"])
        t = _score(s, ["zz", "ab", "ok", "ab"], ["x", "ab", "x", "ab"])
        again = _score(s, ["ok", "ab"], ["x", "ab"])  # the worker restarts after a timeout
        lines = [line for tally in s.fns.tallies.values() if (line := tally.take())]
    assert r.rewards_B.tolist() == [1.0, 2.0, 2.0, 3.0]
    assert r.fn_failed == {"raises": 2, "slow_on_zz": 0, "first": 0} and r.errors == 1
    assert t.fn_failed == {"raises": 0, "slow_on_zz": 2, "first": 0} and t.timeouts == 1
    assert again.fn_failed == {"raises": 0, "slow_on_zz": 0, "first": 0}
    assert len(lines) == 2
    assert any("raises failed in 2 row(s)" in x and "error" in x and "t/train/0" in x and "ValueError: boom on this row" in x
               and "second line" not in x for x in lines)
    assert any("slow_on_zz failed in 2 row(s)" in x and "timeout" in x for x in lines)
    assert all("\n" not in x and "Traceback" not in x for x in lines)


@pytest.mark.parametrize(("name", "completions"), [("raises", ["boom", "boom"]),
                                                   ("sleeps", ["a", "b"])])
def test_a_function_failing_on_every_row_stops_in_one_line(tmp_path, name, completions):
    with _scorer(tmp_path, name, "first", timeout=1.0, workers=2) as s, \
            pytest.raises(RewardFnError) as err:
        _score(s, completions, ["a", "b"])
    said = str(err.value)
    assert said.startswith(f"reward function {name} (") and "on every row of a batch" in said
    assert ("error" if name == "raises" else "timeout") in said and "\n" not in said


def test_failures_on_consecutive_batches_stop(tmp_path):
    """workload.reward_max_fail_steps=2: a clean batch resets the count, two in a row stop."""
    partial, clean = ["boom", "b", "c", "d"], ["a", "b", "c", "d"]
    with _scorer(tmp_path, "raises", workers=2, max_fail_steps=2) as s:
        for batch in (partial, clean, partial):
            assert _score(s, batch, clean).fn_failed["raises"] == (2 if batch == partial else 0)
        with pytest.raises(RewardFnError, match="on 2 consecutive batches"):
            _score(s, partial, clean)


def test_in_training_the_count_is_of_steps(tmp_path):
    """A step fails when any of its batches does (dynamic sampling's, an evaluation's): two
    failing batches of one step are one step; a clean step between failures starts over."""
    partial, clean = ["boom", "b", "c", "d"], ["a", "b", "c", "d"]
    with _scorer(tmp_path, "raises", workers=2, max_fail_steps=2) as s:
        for step, batches in ((0, (partial, partial)), (1, (clean,)), (2, (partial, clean))):
            s.set_step(step, prompts_per_step=4, train_rows=100)
            for batch in batches:
                _score(s, batch, clean)
        s.set_step(3, prompts_per_step=4, train_rows=100)
        with pytest.raises(RewardFnError, match="on 2 consecutive steps"):
            _score(s, partial, clean)


@pytest.mark.parametrize(("name", "said"), [("short", "returned 1 values for 2"),
                                            ("nan", "finite"), ("scalar", "returned a float"),
                                            ("text", "returned a str"), ("huge", "float32")])
def test_a_broken_contract_is_one_line_naming_the_function(tmp_path, name, said):
    with _scorer(tmp_path, name) as s, pytest.raises(RewardFnError) as err:
        _score(s, ["a", "b"], ["a", "b"])
    assert name in str(err.value) and said in str(err.value) and "\n" not in str(err.value)


def test_a_returned_objects_float_runs_in_the_worker(tmp_path):
    """The worker sends plain floats: an object's __float__ runs there, not in the trainer."""
    import os

    with _scorer(tmp_path, "sly") as s:
        r = _score(s, ["a", "b"], ["a", "b"])
    pid = float(r.rewards_B[0])
    assert r.rewards_B[0] == r.rewards_B[1] and pid not in (0.0, float(os.getpid()))


def test_a_bad_spec_fails_at_once(tmp_path):
    with pytest.raises(RewardFnError, match="no function 'nope'"):
        _scorer(tmp_path, "nope")
    with pytest.raises(RewardFnError, match="<path/to/file.py>:<function>"):
        Scorer(RewardSettings(kind=RewardKind.python, reward_fns={"a": "no_colon"}))


def test_the_users_module_is_imported_in_the_worker_only(tmp_path):
    # An import that exits (exit 0 would end the run silently) is one line at start-up; a
    # module that imports is never imported in this (the trainer's) process.
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(0)\ndef f(completions, **kw):\n    return []\n")
    with pytest.raises(RewardFnError, match="importing it raised SystemExit: 0"):
        Scorer(RewardSettings(kind=RewardKind.python, reward_fns={"f": f"{exits}:f"}))
    before = set(sys.modules)
    with _scorer(tmp_path, "first") as s:
        _score(s, ["a"], ["a"])
    assert not [m for m in set(sys.modules) - before if m.startswith("locojax_user_reward_")]


def test_the_file_digest_follows_the_file(tmp_path):
    path = tmp_path / "fns.py"
    path.write_text(FNS)
    before = fn_digest(f"{path}:first")
    path.write_text(FNS + "\n# changed\n")
    assert fn_digest(f"{path}:first") != before


def test_the_digest_follows_the_local_modules_the_file_imports(tmp_path):
    """Issue 41: a resume must see a changed helper next to the reward file (parsed for its
    imports, never run here); a file without local imports keeps its plain sha256."""
    path = tmp_path / "fns.py"
    path.write_text(FNS)
    assert fn_digest(f"{path}:first") == hashlib.sha256(path.read_bytes()).hexdigest()
    (tmp_path / "util").mkdir()
    for name, text in {"helpers.py": "from util.norm import clean\n",
                       "util/__init__.py": "", "util/norm.py": "from . import deep\n",
                       "util/deep.py": "X = 1\n", "unrelated.py": "Y = 1\n"}.items():
        (tmp_path / name).write_text(text)
    path.write_text("import json, helpers\n" + FNS)
    digests = [fn_digest(f"{path}:first")]
    for name in ("helpers.py", "util/norm.py", "util/deep.py", "unrelated.py"):
        (tmp_path / name).write_text((tmp_path / name).read_text() + "# changed\n")
        digests.append(fn_digest(f"{path}:first"))
    # each local module (through helpers -> util.norm -> util.deep) changes it; an unrelated
    # file and json (not local) do not
    assert len(set(digests[:4])) == 4 and digests[4] == digests[3]


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


def test_a_data_dir_keeps_every_column_for_an_environment(tmp_path):
    """workload.data_dir (read through `datasets`, as a hub data set is) keeps every column
    when an environment of the user's reads them (`columns`), as data_files does."""
    rows = [{"question": f"Q: {i}", "answer": f"#### {i}", "n": i} for i in range(8)]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    given = {"data_dir": str(tmp_path), "reward": RewardKind.gsm8k}
    assert load_workload(_settings(**given, columns=True), 0).train[3].columns["n"] == 3
    assert load_workload(_settings(**given), 0).train[3].columns is None


def test_eval_fraction_holds_out_the_same_rows_every_time(tmp_path):
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(200)))
    s = _settings(data_files={"train": str(tmp_path / "t.jsonl")}, eval_fraction=0.25)
    a, b = load_workload(s, 0), load_workload(s, 1)
    assert [p.uid for p in a.eval] == [p.uid for p in b.eval]
    assert 25 <= len(a.eval) <= 75 and len(a.train) + len(a.eval) == 200
    assert not {p.uid for p in a.eval} & {p.uid for p in a.train}
    # Issue 41: a fraction that holds out every usable row leaves nothing to train on.
    (tmp_path / "one.jsonl").write_text(json.dumps(_rows(1)[0]) + "\n")
    one = _settings(data_files={"train": str(tmp_path / "one.jsonl")}, eval_fraction=0.5)
    with pytest.raises(DataError, match=r"^workload.eval_fraction=0.5: holds out every one of "
                                        r"the 1 usable rows .* leaving none to train on"):
        load_workload(one, 0)


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


def test_text_outside_the_tokenizers_alphabet_is_refused_at_start_naming_the_row():
    """Issue 41: a row the char tokenizer cannot encode ended the run in a traceback at the
    step that sampled it; it is now one line at start, naming the row and the characters."""
    from locojax.data import Problem, Workload
    from locojax.runtime.assemble import check_alphabet
    from locojax.tokenizers import load_tokenizer

    char, qwen = load_tokenizer("char"), load_tokenizer("qwen")
    rows = [Problem("custom/train/0", "Q: 12+3", "15"), Problem("custom/train/1", "hello", "x")]
    work = Workload("custom", rows, rows[:1], 0)
    with pytest.raises(DataError, match=r"^train row custom/train/1: characters 'ehlo' are "
                                        r"outside the 'char' tokenizer's alphabet \(1 such"):
        check_alphabet(work, char, "{question}")
    ok = Workload("custom", rows[:1], rows[:1], 0)
    check_alphabet(ok, char, "{question}\nA: ")
    with pytest.raises(DataError, match=r"^workload.prompt_template: characters 'Why' are outside"):
        check_alphabet(ok, char, "Why? {question}")
    check_alphabet(work, qwen, "Why? {question}")  # byte-level: every text encodes

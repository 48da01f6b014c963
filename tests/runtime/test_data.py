"""Workloads: GSM8K and MATH500 files through `datasets`, malformed rows, missing data, arith."""

import json
import logging
from pathlib import Path

import pytest
from paths import DATA, needs_data

from locojax.data import (
    ArithSettings,
    DataError,
    Problem,
    WorkloadSettings,
    arith_problems,
    load_workload,
    problem_space,
    render_prompt,
)
from locojax.rewards import normalize_number

GSM8K = WorkloadSettings(
    name="gsm8k",
    dataset="openai/gsm8k",
    dataset_config="main",
    data_dir=str(DATA / "gsm8k"),
    prompt_template='{question}\nLet\'s think step by step and output the final answer after "####".',
)
NUMINA = WorkloadSettings(
    name="numina_cot",
    dataset="AI-MO/NuminaMath-CoT",
    data_dir=str(DATA / "math500" / "test.jsonl"),
    question_field="problem",
    answer_field="solution",
    reward="boxed",
    prompt_template="{question}\nPlease put your final answer within \\boxed{{}}.",
)


@needs_data
def test_gsm8k_local_files_load_every_row_with_normalised_answers():
    work = load_workload(GSM8K, seed=0)
    assert (len(work.train), len(work.eval), work.skipped) == (7473, 1319, 0)
    first = work.eval[0]
    assert first.uid == "gsm8k/test/0" and first.answer == "18"
    assert first.question.startswith("Janet") and first.solution.endswith("#### 18")
    for p in work.eval:
        tail = p.solution.rsplit("####", 1)[1]
        assert p.answer == normalize_number(tail) and "," not in p.answer
    assert len({p.uid for p in work.train}) == 7473


@needs_data
def test_data_dir_may_name_one_file_for_every_split():
    one_file = WorkloadSettings(
        **{**GSM8K.__dict__, "data_dir": str(DATA / "gsm8k" / "test.jsonl")}
    )
    work = load_workload(one_file, seed=0)
    assert len(work.train) == len(work.eval) == 1319


@needs_data
def test_numina_from_math500_uses_the_solution_field_only():
    work = load_workload(NUMINA, seed=0)
    assert (len(work.train), work.skipped) == (500, 0)
    rows = [json.loads(line) for line in (DATA / "math500" / "test.jsonl").open()]
    assert [p.question for p in work.eval] == [r["problem"] for r in rows]
    # The answer comes from the last \boxed{} of the solution; it equals MATH500's own field.
    assert sum(p.answer == r["answer"] for p, r in zip(work.eval, rows, strict=True)) == 500
    assert work.eval[0].answer == r"\left( 3, \frac{\pi}{2} \right)"


@needs_data
def test_missing_split_file_names_the_setting():
    no_train = WorkloadSettings(**{**NUMINA.__dict__, "data_dir": str(DATA / "math500")})
    with pytest.raises(DataError, match=r"no file .*train\.jsonl.*test\.jsonl.*train_split") as e:
        load_workload(no_train, seed=0)
    assert "\n" not in str(e.value)


def test_missing_hub_data_offline_is_a_one_line_hint():
    hub_only = WorkloadSettings(**{**GSM8K.__dict__, "data_dir": None})
    with pytest.raises(DataError) as e:
        load_workload(hub_only, seed=0)
    message = str(e.value)
    assert "workload.data_dir=../shared/data/gsm8k" in message and "\n" not in message


def test_an_unreachable_hub_is_named_by_the_probe_not_by_datasets_retries(monkeypatch):
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy",
                "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    hub_only = WorkloadSettings(**{**GSM8K.__dict__, "data_dir": None})
    with pytest.raises(DataError) as e:
        load_workload(hub_only, seed=0)
    message = str(e.value)
    assert "127.0.0.1:9 unreachable" in message and "HF_HUB_OFFLINE=1" in message
    assert "workload.data_dir=../shared/data/gsm8k" in message and "\n" not in message


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_malformed_rows_are_counted_reported_once_and_skipped(tmp_path, caplog):
    good = {"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}
    rows = [
        json.dumps(good),
        json.dumps({"answer": "#### 1"}),  # row 2: no question
        json.dumps({"question": 7, "answer": "#### 7"}),  # row 3: not a string
        json.dumps({"question": "q", "answer": "no marker here"}),  # row 4: no #### number
        json.dumps({"question": "q", "answer": None}),
        json.dumps({**good, "answer": "#### 1,234.50"}),
    ]
    _write(tmp_path / "train.jsonl", rows)
    _write(tmp_path / "test.jsonl", [json.dumps(good)])
    settings = WorkloadSettings(name="gsm8k", data_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="locojax.data"):
        work = load_workload(settings, seed=0)
    assert [p.answer for p in work.train] == ["4", "1234.5"] and work.skipped == 4
    assert [p.uid for p in work.train] == ["gsm8k/train/0", "gsm8k/train/5"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "skipped 4 malformed of 6 rows" in warnings[0]
    assert f"row 2 of {tmp_path / 'train.jsonl'}" in warnings[0]


@pytest.mark.parametrize("reward", ["gsm8k", "python"])
def test_a_row_over_max_row_bytes_is_skipped_and_counted(tmp_path, caplog, reward):
    """A 2 MB row (a long question; a chat-form row of long messages) over the default
    1 MiB is skipped and counted, the line saying its size; a larger bound keeps it."""
    good = {"question": "What is 2+2?", "answer": "#### 4"}
    rows = [good, {"question": "x" * 2_000_000, "answer": "#### 1"}, good,
            {**good, "extra": [{"role": "user", "content": "é" * 1_000_000}]}]
    path = _write(tmp_path / "rows.jsonl", [json.dumps(r) for r in rows])
    settings = WorkloadSettings(name="custom", data_files={"train": str(path)}, reward=reward,
                                eval_fraction=0.0 if reward == "gsm8k" else 0.25)
    with caplog.at_level(logging.WARNING, logger="locojax.data"):
        work = load_workload(settings, seed=0)
    assert work.skipped == 2
    assert {p.question for p in [*work.train, *work.eval]} == {"What is 2+2?"}
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"row 2 of {path}: 2,000,0" in line and "over workload.max_row_bytes=1048576" in line
    roomy = WorkloadSettings(**{**settings.__dict__, "max_row_bytes": 4_000_000})
    assert load_workload(roomy, seed=0).skipped == 0


def test_a_line_that_is_not_json_is_skipped_too(tmp_path, caplog):
    good = json.dumps({"problem": "p", "solution": r"so \boxed{\frac{1}{2}}."})
    _write(tmp_path / "test.jsonl", [good, "{not json", good, json.dumps({"problem": "p"})])
    settings = WorkloadSettings(
        name="numina_cot",
        data_dir=str(tmp_path / "test.jsonl"),
        question_field="problem",
        answer_field="solution",
        reward="boxed",
    )
    with caplog.at_level(logging.WARNING, logger="locojax.data"):
        work = load_workload(settings, seed=0)
    assert [p.answer for p in work.eval] == [r"\frac{1}{2}"] * 2 and work.train == work.eval
    assert [p.uid for p in work.eval] == ["numina_cot/test/0", "numina_cot/test/2"]
    assert work.skipped == 2  # the one file serves both splits and is read once
    assert sum("row 2 of" in r.getMessage() for r in caplog.records) == 1


def test_a_missing_column_is_a_data_error_naming_the_key(tmp_path):
    _write(tmp_path / "train.jsonl", [json.dumps({"q": "x", "answer": "#### 1"})] * 3)
    settings = WorkloadSettings(name="gsm8k", data_dir=str(tmp_path / "train.jsonl"))
    with pytest.raises(DataError, match=r"no column 'question' \(workload\.question_field"):
        load_workload(settings, seed=0)


def test_prompt_template_and_chat_wrapper():
    problem = Problem("u", "What is {x}?", "3")
    text = render_prompt(problem, NUMINA.prompt_template)
    assert text == "What is {x}?\nPlease put your final answer within \\boxed{}."
    chat = render_prompt(problem, "{question}", chat=lambda s: f"<user>{s}</user>")
    assert chat == "<user>What is {x}?</user>"
    with pytest.raises(DataError, match="prompt_template"):
        render_prompt(problem, "{question} {answer}")


def test_unknown_reward_kind_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="workload.reward='exact'"):
        load_workload(WorkloadSettings(name="gsm8k", data_dir=str(tmp_path), reward="exact"), 0)


def test_arith_is_deterministic_correct_and_disjoint():
    settings = ArithSettings(min_operand=0, max_operand=99, terms=3, ops="+-*", train_size=5000)
    train, held_out = arith_problems(settings, seed=3)
    again, held_again = arith_problems(settings, seed=3)
    assert held_out == held_again and train[:50] == again[:50] and train[4999] == again[-1]
    assert len(held_out) == 256 and len({p.question for p in held_out}) == 256
    eval_questions = {p.question for p in held_out}
    problems = list(held_out) + train[:]
    assert not eval_questions & {p.question for p in train[:]}
    alphabet = set("0123456789+-*= #\n")
    for p in problems:
        expr = p.question.removesuffix("=")
        assert eval(expr) == int(p.answer)  # the question is digits and + - * only
        assert p.solution == f"#### {p.answer}" and set(p.question + p.solution) <= alphabet
        operands = [int(x) for x in expr.replace("-", "+").replace("*", "+").split("+")]
        assert len(operands) == 3 and all(0 <= x <= 99 for x in operands)
    assert {c for p in problems for c in p.question if not c.isdigit()} == set("+-*=")
    other, _ = arith_problems(settings, seed=4)
    assert sum(a == b for a, b in zip(train[:200], other[:200], strict=True)) < 20


def test_arith_small_space_holds_out_a_fifth():
    settings = ArithSettings()  # single-digit a+b: 100 distinct problems
    train, held_out = arith_problems(settings, seed=0)
    assert problem_space(settings) == 100 and len(held_out) == 20 and len(train) == 100_000
    seen = {train[i].question for i in range(0, 100_000, 97)}
    assert len(seen) == 80 and not seen & {p.question for p in held_out}


@pytest.mark.parametrize(
    "bad, key",
    [
        (ArithSettings(min_operand=-1), "min_operand"),
        (ArithSettings(min_operand=5, max_operand=4), "max_operand"),
        (ArithSettings(ops="/"), "ops"),
        (ArithSettings(max_operand=1, terms=2), "fewer than 5"),
    ],
)
def test_arith_rejects_bad_settings(bad, key):
    with pytest.raises(DataError, match=key):
        arith_problems(bad, seed=0)


def test_arith_workload_needs_no_data():
    work = load_workload(WorkloadSettings(name="arith"), seed=0)
    assert work.train[0].question.endswith("=") and work.skipped == 0


def test_a_line_that_is_not_utf8_is_skipped_and_named(tmp_path, caplog):
    good = json.dumps({"question": "What is 2+2?", "answer": "#### 4"}).encode()
    (tmp_path / "train.jsonl").write_bytes(b"\n".join(
        [good, good[:10] + b"\xff\xfe\x80" + good[10:], good]) + b"\n")
    _write(tmp_path / "test.jsonl", [good.decode()])
    with caplog.at_level(logging.WARNING, logger="locojax.data"):
        work = load_workload(WorkloadSettings(name="gsm8k", data_dir=str(tmp_path)), seed=0)
    assert [p.uid for p in work.train] == ["gsm8k/train/0", "gsm8k/train/2"]
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert f"row 2 of {tmp_path / 'train.jsonl'}: not UTF-8 (byte 0xff at column 11)" in warning


def test_a_split_that_is_a_directory_is_named(tmp_path):
    (tmp_path / "train.jsonl").mkdir()
    with pytest.raises(DataError, match=r"train.jsonl is not a file"):
        load_workload(WorkloadSettings(name="gsm8k", data_dir=str(tmp_path)), seed=0)

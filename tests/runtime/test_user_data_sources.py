"""Data of the user's beyond flat files: rows already in chat form (`workload.messages_field`),
a directory `datasets` saved (`save_to_disk`), and hub names in `workload.data_files`."""

import json
import logging

import pytest

from compiler.vocab import RewardKind
from locojax.data import DataError, Problem, WorkloadSettings, load_workload, render_prompt
from locojax.tokenizers import apply_chat_template

SYSTEM = {"role": "system", "content": "Answer in one word."}


def _chat(q, *extra):
    return [SYSTEM, {"role": "user", "content": q}, *extra]


def _settings(**given):
    return WorkloadSettings(**({"name": "custom", "reward": RewardKind.python,
                                "messages_field": "messages"} | given))


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_chat_rows_are_prompts_and_bad_ones_are_counted(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    rows = [{"messages": _chat("Q0"), "target": "a"},
            {"messages": _chat("Q1", {"role": "assistant", "content": "yes"})},
            {"messages": "not a list", "target": "c"},
            {"messages": [{"role": "robot", "content": "hi"}], "target": "d"},
            {"target": "no messages"},
            {"messages": [SYSTEM], "target": "f"}]
    w = load_workload(_settings(data_files={"train": _write(tmp_path / "c.jsonl", rows)}), 0)
    assert [p.question for p in w.train] == ["Q0", "Q1"] and w.skipped == 4
    first, second = w.train
    assert first.messages == (("system", SYSTEM["content"]), ("user", "Q0"))
    assert first.columns["messages"] == rows[0]["messages"]  # reward functions get it too
    assert second.answer == "yes" and second.messages[-1] == ("user", "Q1")
    said = [r.getMessage() for r in caplog.records if "skipped 4" in r.getMessage()]
    assert len(said) == 1 and "row 3" in said[0] and "'messages'" in said[0]


def test_a_chat_row_renders_through_the_chat_template():
    messages = (("system", SYSTEM["content"]), ("user", "Q0"))
    chat_row = Problem("u", "Q0", "a", messages=messages)
    plain_row = Problem("u", "Q0", "a")
    template = apply_chat_template  # what HostWork.encode passes
    text = render_prompt(chat_row, "{question}", None, template)
    assert text == apply_chat_template([{"role": r, "content": c} for r, c in messages])
    assert text.startswith("<|im_start|>system\nAnswer in one word.<|im_end|>\n")
    single = Problem("u", "Q0", "a", messages=(("user", "Q0"),))
    assert render_prompt(single, "ignored {question}", None, template) == render_prompt(
        plain_row, "{question}", lambda s: template([{"role": "user", "content": s}]))
    assert render_prompt(chat_row, "{question}") == "Q0"  # the prompt reward functions get


def test_builtin_rewards_take_the_answer_from_the_final_assistant_message(tmp_path):
    rows = [{"messages": _chat("2+3?", {"role": "assistant", "content": "5 #### 5"})},
            {"messages": _chat("1+1?"), "answer": "so #### 2"},
            {"messages": _chat("no answer")}]
    w = load_workload(_settings(reward=RewardKind.gsm8k, name="chat", data_files={
        "train": _write(tmp_path / "c.jsonl", rows)}), 0)
    assert [(p.question, p.answer) for p in w.train] == [("2+3?", "5"), ("1+1?", "2")]
    assert w.skipped == 1


def test_a_missing_messages_field_names_file_row_and_field(tmp_path):
    path = _write(tmp_path / "c.jsonl", [{"question": "Q", "target": "a"}])
    with pytest.raises(DataError) as err:
        load_workload(_settings(data_files={"train": path}), 0)
    text = str(err.value)
    assert path in text and "row 1" in text and "'messages'" in text
    assert "workload.messages_field" in text and "\n" not in text


def test_a_directory_saved_by_datasets_reads_as_its_jsonl(tmp_path):
    import datasets

    rows = [{"question": f"Q{i}", "target": str(i)} for i in range(12)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:8]),
                          "test": datasets.Dataset.from_list(rows[8:])}
                         ).save_to_disk(str(tmp_path / "both"))
    flat = _settings(messages_field=None)
    jsonl = load_workload(flat.__class__(**{**flat.__dict__, "data_files": {
        "train": _write(tmp_path / "t.jsonl", rows)}}), 0)
    saved = load_workload(flat.__class__(**{**flat.__dict__, "data_files": {
        "train": str(tmp_path / "one")}}), 0)
    assert [(p.question, p.columns) for p in saved.train] == [
        (p.question, p.columns) for p in jsonl.train]
    split = load_workload(flat.__class__(**{**flat.__dict__, "data_files": {
        "train": str(tmp_path / "both"), "eval": str(tmp_path / "both")}}), 0)
    assert [p.question for p in split.train] == [f"Q{i}" for i in range(8)]
    assert [p.question for p in split.eval] == [f"Q{i}" for i in range(8, 12)]  # eval_split


@pytest.mark.parametrize(("value", "split"), [("nosuchorg/nosuch-set", "train"),
                                              ("nosuchorg/nosuch-set:validation", "validation")])
def test_a_hub_name_goes_through_datasets_and_fails_in_one_line(monkeypatch, value, split):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network here: datasets fails at once
    with pytest.raises(DataError) as err:
        load_workload(_settings(messages_field=None, data_files={"train": value}), 0)
    text = str(err.value)
    assert text.startswith(f"workload.data_files.train={value}: cannot load hub data set "
                           f"nosuchorg/nosuch-set split {split!r} (")
    assert "\n" not in text and "no file" not in text

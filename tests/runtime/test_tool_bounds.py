"""Issue 62, item 3: what the model reads of its tools is bounded and every cut counted: a
result of any size is cut to `workload.max_tool_result_tokens` tokens with a marker
(`tool_results_cut`), its worker sending at most 16 characters a token; a result that is
neither a str nor a JSON value is an error message the model reads (`tool_errors`); a reply
with hundreds of calls runs `workload.max_tool_calls` of them and says so once
(`tool_calls_dropped`)."""

import json
import time
from pathlib import Path

import pytest

from locojax.envs.bounds import CHARS_PER_TOKEN, CUT_MARK, bounded_result, sent_text
from locojax.envs.runner import EnvRunner, EnvSpec
from locojax.tokenizers.char import load_char
from locojax.tokenizers.qwen import load_qwen3

TOOLS = '''
import datetime
import math

def big(n: int) -> str:
    """A result of n characters.

    Args:
        n: How many.
    """
    return "word " * (n // 5)

def odd(kind: str) -> object:
    """A result that is no JSON value.

    Args:
        kind: Which.
    """
    return {"set": {1, 2}, "bytes": b"x", "date": datetime.date(2024, 1, 2), "nan": math.nan,
            "object": object(), "keys": {(1, 2): 3}}[kind]

def one() -> int:
    """One."""
    return 1
'''
QWEN = load_qwen3()


def call(name: str, **arguments) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


@pytest.fixture
def runner(tmp_path: Path):
    (tmp_path / "tools.py").write_text(TOOLS)
    spec = EnvSpec(env="", tools=tuple((n, f"{tmp_path}/tools.py:{n}") for n in
                                       ("big", "odd", "one")),
                   step_timeout_s=30, tool_timeout_s=30, workers=1, max_calls=8,
                   max_result_tokens=64)
    r = EnvRunner(spec, QWEN)
    r.open([{"prompt": "p"}] * 4)
    yield r
    r.close()


def test_a_result_of_any_size_is_cut_to_its_tokens_with_a_marker(runner):
    start = time.monotonic()
    turn = runner.step({0: call("big", n=50_000_000), 1: call("big", n=100)})
    assert time.monotonic() - start < 20
    cut, whole = turn[0].messages[0]["content"], turn[1].messages[0]["content"]
    assert cut.endswith(CUT_MARK.format(n=64)) and cut.startswith("word word")
    assert len(QWEN.encode(cut.removesuffix(CUT_MARK.format(n=64)))) <= 64
    assert whole == "word " * 20
    assert (turn[0].results_cut, turn[1].results_cut, turn[0].tool_errors) == (1, 0, 0)


@pytest.mark.parametrize("kind", ["set", "bytes", "date", "nan", "object", "keys"])
def test_a_result_that_is_no_json_value_is_an_error_the_model_reads(runner, kind):
    turn = runner.step({0: call("odd", kind=kind)})[0]
    said = turn.messages[0]["content"]
    assert said.startswith("error: TypeError: the tool returned a ") and "neither a str nor" \
        in said and "\n" not in said
    assert (turn.tool_calls, turn.tool_errors, turn.done) == (1, 1, False)
    assert "failed in 1 episode turn(s)" in runner.tallies[1].take()


def test_hundreds_of_calls_in_one_reply_run_the_first_and_say_so_once(runner):
    start = time.monotonic()
    turn = runner.step({0: call("one") * 300})[0]
    assert time.monotonic() - start < 20
    assert [m["content"] for m in turn.messages] == ["1"] * 8 + [
        "error: 292 more tool calls in this reply were not run (workload.max_tool_calls=8)"]
    assert (turn.tool_calls, turn.calls_dropped, turn.tool_errors) == (8, 292, 0)


def test_the_worker_sends_at_most_its_characters_and_the_host_reads_its_tokens():
    assert sent_text("x" * 10, 64) == "x" * 10
    assert sent_text("x" * 10_000, 4) == "x" * (4 * CHARS_PER_TOKEN + 1)
    assert sent_text("x" * 10_000, 0) == "x" * 10_000
    ascii_tok = load_char("ascii")
    text, cut = bounded_result("abcdefghij", ascii_tok, 4)
    assert (text, cut) == ("abcd" + CUT_MARK.format(n=4), True)
    assert bounded_result("abcd", ascii_tok, 4) == ("abcd", False)
    assert ascii_tok.encode(CUT_MARK.format(n=4))  # the marker is in the ascii alphabet

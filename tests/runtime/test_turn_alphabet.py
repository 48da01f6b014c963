"""Issue 62, item 6: a tokenizer that cannot write the turn format (the char model with an
environment or tools: no letters for `User: ` and `Assistant: `) is refused at start-up in one
line naming the fix, and a message of an environment or a tool it cannot encode is one line,
never a traceback (`ValueError` from `tokenizers.base` was the arith_co + env failure). Through
`python -m locojax`: tests/e2e/test_env_faults.py and scripts/bad_inputs.py (r62 cases)."""

import pytest

from locojax.runtime.errors import UserError
from locojax.runtime.turns import TURN_FIX, TurnFormat, check_turn_alphabet
from locojax.tokenizers.char import load_char

TOOL = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}


@pytest.mark.parametrize("tools", [(), (TOOL,)])
def test_the_char_tokenizer_is_refused_naming_the_fix(tools):
    fmt = TurnFormat(load_char(), chat=False, thinking=False, tools=tools)
    with pytest.raises(UserError) as info:
        check_turn_alphabet(fmt, "model.tokenizer=char")
    line = str(info.value)
    assert "\n" not in line and line.startswith("model.tokenizer=char: cannot write the turn ")
    assert f"use {TURN_FIX}" in line and "'U'" in line


def test_the_ascii_tokenizer_writes_the_plain_format():
    fmt = TurnFormat(load_char("ascii"), chat=False, thinking=False, tools=(TOOL,))
    check_turn_alphabet(fmt, "model.tokenizer=ascii")
    assert fmt.opening([{"role": "user", "content": "2+3?"}])


@pytest.mark.parametrize("where", ["opening", "after_reply"])
def test_a_message_the_tokenizer_cannot_encode_is_one_line(where):
    fmt = TurnFormat(load_char("ascii"), chat=False, thinking=False)
    with pytest.raises(UserError, match=r"message.*cannot encode characters \['é'\]") as info:
        getattr(fmt, where)([{"role": "user", "content": "café"}])
    assert "\n" not in str(info.value)

"""Issue 60, item 3 and the zero-retokenization property: each family's chat template (in the
style of its own, tests/chat_families.py) with tools: the call convention found from the
template, the calls parsed in it, a start-up probe of a whole tool round trip, and, over
random tool and environment episodes, a trained row that is exactly the sampled ids plus the
environment's ids, the mask on the sampled ones."""

import dataclasses

import pytest
from chat_families import GEMMA3, LLAMA31, QWEN25, SMOLLM2, SMOLLM3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from locojax.envs.calculator import add
from locojax.envs.call_formats import FORMATS, ToolFormat, parse_json_calls
from locojax.envs.runner import TurnResult
from locojax.envs.tools import ToolCall, tool_schema
from locojax.runtime.errors import UserError
from locojax.runtime.turns import (
    TurnFormat,
    TurnLimits,
    _Episode,
    _take_reply,
    _take_turn,
    call_format,
    check_turn_template,
)
from locojax.tokenizers.jinja_chat import ChatTemplate
from locojax.tokenizers.qwen import load_qwen3

TOOLS = (tool_schema(add),)
SPECIALS = {"llama3": ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                       "<|eot_id|>", "<|python_tag|>"),
            "gemma3": ("<bos>", "<start_of_turn>", "<end_of_turn>")}
FAMILIES = {  # family: (template, bos, stop token, call convention)
    "qwen3": (None, None, "<|im_end|>", ToolFormat.qwen),
    "qwen2.5": (QWEN25, None, "<|im_end|>", ToolFormat.qwen),
    "llama3": (LLAMA31, "<|begin_of_text|>", "<|eot_id|>", ToolFormat.llama3),
    "gemma3": (GEMMA3, "<bos>", "<end_of_turn>", ToolFormat.plain),
    "smollm2": (SMOLLM2, None, "<|im_end|>", ToolFormat.plain),
    "smollm3": (SMOLLM3, None, "<|im_end|>", ToolFormat.qwen),
}
CALLS = {ToolFormat.qwen: '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
                          '</tool_call>',
         ToolFormat.plain: '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
         ToolFormat.llama3: '{"name": "add", "parameters": {"a": 1, "b": 2}}'}


def family_tokenizer(family: str):
    """Qwen3's vocabulary under the family's template, its turn tokens added (special) and
    its end-of-turn token the stop id."""
    template, bos, stop, _ = FAMILIES[family]
    tok = load_qwen3()
    if family in SPECIALS:
        backend = Backend.from_str(tok.backend.to_str())
        backend.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS[family]])
        tok = dataclasses.replace(tok, backend=backend)
    end = tok.token_id(stop)
    if template is None:
        return tok
    return dataclasses.replace(tok, eos_id=end, stop_ids=(end,), chat_template=ChatTemplate
                               .from_jinja(template, bos_token=bos, eos_token=stop))


def family_format(family: str, tools=TOOLS) -> TurnFormat:
    tok = family_tokenizer(family)
    return TurnFormat(tok, chat=True, thinking=False, tools=tools,
                      calls=call_format(tok, True, False))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_familys_template_gives_its_call_convention_and_a_round_trip(family):
    fmt = family_format(family)
    assert fmt.calls is FAMILIES[family][3]
    check_turn_template(fmt, family)  # user, assistant call, tool result, assistant
    assert FORMATS[fmt.calls].parse(CALLS[fmt.calls]) == ([ToolCall("add", {"a": 1, "b": 2})], 0)
    opening = fmt.tokenizer.decode(fmt.opening([{"role": "user", "content": "1+2?"}]),
                                   skip_special=False)
    assert "add" in opening  # the tools are described, by the template or by the plain format


def test_llama3_json_calls():
    assert parse_json_calls('<|python_tag|>{"name": "add", "parameters": {"a": 1}}') == (
        [ToolCall("add", {"a": 1})], 0)
    assert parse_json_calls('{"name": "a", "arguments": {}}; {"name": "b", "parameters": {}}'
                            ) == ([ToolCall("a", {}), ToolCall("b", {})], 0)
    assert parse_json_calls("The answer is 3.") == ([], 0)
    assert parse_json_calls('{"name": "add", "parameters": [1]}') == ([], 1)
    assert parse_json_calls("{not json") == ([], 1)


ONE_EXCHANGE = ("{% for m in messages %}{% if loop.index0 > 1 %}{{ raise_exception('one "
                "exchange only') }}{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                "{% endif %}")


def test_a_template_that_cannot_render_a_tool_round_trip_is_refused_in_one_line():
    tok = load_qwen3()
    tok = dataclasses.replace(tok, chat_template=ChatTemplate.from_jinja(
        ONE_EXCHANGE, eos_token="<|im_end|>"))
    fmt = TurnFormat(tok, chat=True, thinking=False, tools=TOOLS,
                     calls=call_format(tok, True, False))
    with pytest.raises(UserError, match="model.family=gemma3 ") as err:
        check_turn_template(fmt, "gemma3")
    assert "\n" not in str(err.value) and "one exchange only" in str(err.value)


R = 12
TEXT = st.text(alphabet="abc 12+=#.\n", min_size=1, max_size=20)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from(sorted(FAMILIES)), data=st.data())
def test_a_trained_row_is_the_sampled_ids_plus_the_environments(family, data):
    """Random episodes of replies (random ids, cut at R or closed by the stop token) and
    environment answers (tool results and user messages in any order): the row is the
    opening, then each reply's sampled ids exactly (mask on) and each answer's ids exactly
    as the template continues the episode (mask off); nothing is re-encoded."""
    fmt = family_format(family)
    tok, stop = fmt.tokenizer, fmt.turn_end()[0]
    limits = TurnLimits(prompt=512, episode=4096, reply=R, turns=4, stop_ids=(stop,),
                        pad_id=tok.pad_id)
    prompt = fmt.opening([{"role": "user", "content": data.draw(TEXT)}])
    e = _Episode(prompt, [{"role": "user", "content": "q"}])
    want_ids, want_mask = [], []
    for turn in range(data.draw(st.integers(1, 3))):
        sampled = data.draw(st.lists(st.integers(300, 5000), min_size=1, max_size=R))
        stopped = len(sampled) < R and data.draw(st.booleans())
        reply = sampled + [stop] if stopped else sampled
        _take_reply(e, (reply, [-1.0] * len(reply), [-1.0] * len(reply)), limits, fmt)
        close = [] if stopped else fmt.turn_end()
        want_ids += reply + close
        want_mask += [True] * len(reply) + [False] * len(close)
        messages = tuple({"role": data.draw(st.sampled_from(["tool", "user"])),
                          "content": data.draw(TEXT)}
                         for _ in range(data.draw(st.integers(1, 2))))
        more = fmt.after_reply(messages)
        _take_turn(e, TurnResult(messages, 0.0, False, 0, 0, None, 0.0), fmt, limits,
                   last=turn == 3)
        want_ids += more
        want_mask += [False] * len(more)
    assert e.ids == want_ids and e.model == want_mask and e.prompt == prompt

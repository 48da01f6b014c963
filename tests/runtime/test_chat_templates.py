"""A checkpoint's own chat template (`tokenizers.jinja_chat`, `hf_dir.load_checkpoint`), rendered
as transformers renders it: Llama-3- and Qwen2.5-style templates to hand-written text, the
sandbox, errors in one line, and the call sites that render through `Tokenizer.chat`.

Qwen3's hand-written renderer against `render_jinja` of its own Jinja text is checked in
test_envs_tools.py (`test_the_jinja_template_renders_tools_as_the_python_one`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from locojax.data import Problem
from locojax.runtime.errors import UserError
from locojax.runtime.hostwork import HostWork
from locojax.runtime.turns import TurnFormat, check_turn_template
from locojax.tokenizers import Tokenizer, apply_chat_template, save_checkpoint_tokenizer
from locojax.tokenizers.char import load_char
from locojax.tokenizers.chat import CHAT_TEMPLATE_JINJA
from locojax.tokenizers.hf_dir import load_checkpoint
from locojax.tokenizers.jinja_chat import ChatTemplate, render_jinja
from locojax.tokenizers.qwen import load_qwen3

LLAMA3 = r"""{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = '26 Jul 2024' %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = '' %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}
{{- 'Cutting Knowledge Date: December 2023\n' }}
{{- 'Today Date: ' + date_string + '\n\n' }}
{{- system_message + '<|eot_id|>' }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""
"""In the style of Llama 3.1's template (no tools)."""

QWEN25 = r"""{%- set default_system = 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' %}
{%- set system = messages[0]['content'] if messages[0]['role'] == 'system' else default_system %}
{{- '<|im_start|>system\n' + system }}
{%- if tools %}
    {{- '\n\n# Tools\n\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>' }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- for message in messages %}
    {%- if loop.first and message.role == 'system' %}
        {%- continue %}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {{- '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
"""In the style of Qwen2.5's template (a default system message; `continue` from the loop
controls extension)."""

SYSTEM = {"role": "system", "content": "Be brief. "}
USER = {"role": "user", "content": "What is 2+3?"}
ANSWER = {"role": "assistant", "content": " 5\n"}
FOLLOW_UP = {"role": "user", "content": "And 3+4?"}
TOOL = {"type": "function", "function": {"name": "café", "description": "<b> & 'q'"}}


def test_a_llama3_style_template_renders_bos_the_headers_and_trimmed_content():
    got = render_jinja(LLAMA3, [SYSTEM, USER, ANSWER, FOLLOW_UP], bos_token="<|begin_of_text|>",
                       eos_token="<|eot_id|>")
    assert got == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "Be brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n5<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAnd 3+4?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # No generation prompt, no system message; a bos left None is undefined (renders empty).
    assert render_jinja(LLAMA3, [USER], add_generation_prompt=False, bos_token=None) == (
        "<|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
    )


def test_a_qwen25_style_template_adds_its_default_system_message_and_tools():
    assert render_jinja(QWEN25, [USER, ANSWER], add_generation_prompt=False) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\n 5\n<|im_end|>\n"
    )
    got = render_jinja(QWEN25, [SYSTEM, USER, {"role": "tool", "content": "5"}], tools=[TOOL])
    assert got == (
        "<|im_start|>system\nBe brief. \n\n# Tools\n\n<tools>\n"
        '{"type": "function", "function": {"name": "café", "description": "<b> & \'q\'"}}\n'
        "</tools><|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_the_environment_gives_tojson_options_strftime_now_and_enable_thinking():
    assert render_jinja("{{ tools[0] | tojson(indent=2) }}", [], tools=[{"a": "é"}]) == (
        '{\n  "a": "é"\n}')
    assert render_jinja("{{ tools[0] | tojson(sort_keys=true) }}", [], tools=[{"b": 1, "a": 2}]
                        ) == '{"a": 2, "b": 1}'
    year = render_jinja("{{ strftime_now('%Y') }}", [])
    assert year in {str(datetime.date.today().year), str(datetime.date.today().year + 1)}
    thinking = "{{ 'on' if enable_thinking else 'off' }}{{ add_generation_prompt }}"
    assert render_jinja(thinking, [], enable_thinking=False) == "offTrue"


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__ }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ messages.append(1) }}",  # the sandbox is immutable: no list method that changes it
])
def test_the_sandbox_refuses_unsafe_attributes_in_one_line(template):
    with pytest.raises(ValueError, match=r"^chat template.*(unsafe|Python's internals)") as info:
        render_jinja(template, [USER])
    assert "\n" not in str(info.value)


def test_raise_exception_and_compile_errors_are_value_errors_naming_the_cause():
    no_system = "{% if messages[0].role != 'system' %}{{ raise_exception('no system role') }}"
    with pytest.raises(ValueError, match="^chat template: no system role$"):
        render_jinja(no_system + "{% endif %}", [USER])
    with pytest.raises(ValueError, match="^chat template does not compile: line 1: "):
        render_jinja("{% if %}", [USER])
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate.from_jinja("{% for m in messages %}")


def test_chat_template_kinds_render_through_their_renderer():
    messages = [SYSTEM, USER, ANSWER, FOLLOW_UP]
    assert ChatTemplate.qwen3().render(messages, tools=[TOOL]) == apply_chat_template(
        messages, tools=[TOOL])
    # Qwen3's own Jinja text (what an export writes) takes the Python fast path.
    assert ChatTemplate.from_jinja(CHAT_TEMPLATE_JINJA, "<s>", "</s>") == ChatTemplate.qwen3()
    llama = ChatTemplate.from_jinja(LLAMA3, bos_token="<|begin_of_text|>")
    assert llama.render([USER]) == render_jinja(LLAMA3, [USER], bos_token="<|begin_of_text|>")
    char = load_char()
    assert char.chat_template is None
    assert char.chat(messages, enable_thinking=False) == apply_chat_template(
        messages, enable_thinking=False)


# --- load_checkpoint -----------------------------------------------------------------------------

CHAR_TEMPLATE = ("{{ bos_token }}{% for m in messages %}Q: {{ m.content }}{{ eos_token }}\n"
                 "{% endfor %}{% if add_generation_prompt %}A:{% endif %}")
"""A template whose text the char tokenizer can encode."""


def _checkpoint(tmp_path, **config) -> tuple[str, dict]:
    """A char-tokenizer checkpoint dir in `tmp_path`, its tokenizer_config.json updated."""
    save_checkpoint_tokenizer(load_char(), tmp_path)
    path = tmp_path / "tokenizer_config.json"
    tcfg = json.loads(path.read_text()) | config
    path.write_text(json.dumps(tcfg))
    return str(path), tcfg


def test_load_checkpoint_reads_the_config_template_with_its_token_strings(tmp_path):
    _checkpoint(tmp_path, chat_template=CHAR_TEMPLATE, bos_token={"content": "<bos>"})
    tok = load_checkpoint(tmp_path)
    assert tok.chat_template == ChatTemplate(CHAR_TEMPLATE, bos_token="<bos>", eos_token="<eos>")
    text = tok.chat([{"role": "user", "content": "2+3?"}])
    assert text == "<bos>Q: 2+3?<eos>\nA:"
    assert tok.encode(text)[:2] == [tok.bos_id, tok.token_id("Q")]


def test_load_checkpoint_takes_the_default_named_template_and_the_jinja_file_first(tmp_path):
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    _checkpoint(tmp_path, chat_template=named)
    assert load_checkpoint(tmp_path).chat([USER]) == "D"
    (tmp_path / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert load_checkpoint(tmp_path).chat([USER]) == "J1"


def test_load_checkpoint_without_a_template_chats_as_qwen3(tmp_path):
    _checkpoint(tmp_path)
    tok = load_checkpoint(tmp_path)
    assert tok.chat_template is None
    assert tok.chat([USER], enable_thinking=False) == apply_chat_template(
        [USER], enable_thinking=False)


@pytest.mark.parametrize("template, why", [
    ("{% if %}", "chat template does not compile: line 1: "),
    ([{"name": "tool_use", "template": "T"}], "chat_template names no 'default' template"),
    (7, "chat_template is a int"),
])
def test_a_bad_template_is_a_value_error_naming_the_config(tmp_path, template, why):
    path, _ = _checkpoint(tmp_path, chat_template=template)
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: {why}")):
        load_checkpoint(tmp_path)


def test_a_broken_jinja_file_is_named(tmp_path):
    _checkpoint(tmp_path, chat_template=CHAR_TEMPLATE)
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "chat_template.jinja"))):
        load_checkpoint(tmp_path)


# --- the call sites ------------------------------------------------------------------------------


def _char_with_template() -> Tokenizer:
    return dataclasses.replace(load_char(), chat_template=ChatTemplate.from_jinja(CHAR_TEMPLATE))


def test_the_multi_turn_opening_renders_with_the_tokenizers_template():
    tok = _char_with_template()
    fmt = TurnFormat(tok, chat=True, thinking=False)
    assert fmt.opening([{"role": "user", "content": "2+3?"}]) == tok.encode("Q: 2+3?\nA:")


def _llama_tokenizer() -> Tokenizer:
    """Qwen3's vocabulary with Llama 3's turn tokens added (special; <|eot_id|> the stop
    token), under the Llama-3-style template."""
    tok = load_qwen3()
    backend = Backend.from_str(tok.backend.to_str())
    backend.add_special_tokens([AddedToken(t, special=True) for t in (
        "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")])
    eot = backend.token_to_id("<|eot_id|>")
    return dataclasses.replace(tok, backend=backend, eos_id=eot, stop_ids=(eot,),
                               chat_template=ChatTemplate.from_jinja(
                                   LLAMA3, bos_token="<|begin_of_text|>",
                                   eos_token="<|eot_id|>"))


@pytest.mark.parametrize("style", ["llama3", "qwen25"])
def test_an_episode_continues_in_the_checkpoints_own_template(style):
    """Opening, replies (one closed by the model's stop token, one cut and closed with the
    template's), the environment's and a tool's messages: the transcript's text is the
    template's rendering of the whole conversation, and the cut reply's close is the token
    the template ends a reply with."""
    tok = _llama_tokenizer() if style == "llama3" else dataclasses.replace(
        load_qwen3(), chat_template=ChatTemplate.from_jinja(QWEN25))
    fmt = TurnFormat(tok, chat=True, thinking=False)
    check_turn_template(fmt)
    end = {"llama3": "<|eot_id|>", "qwen25": "<|im_end|>"}[style]
    assert fmt.turn_end() == [tok.token_id(end)]
    messages = [USER]
    ids = fmt.opening(messages)
    for reply, more in (("Seven?", [{"role": "user", "content": "Higher."}]),
                        ("Nine", [{"role": "tool", "content": "9"},
                                  {"role": "user", "content": "Right."}])):
        ids += tok.encode(reply) + fmt.turn_end()
        messages += [{"role": "assistant", "content": reply}, *more]
        ids += fmt.after_reply(more)
    assert tok.decode(ids, skip_special=False) == tok.chat(messages, enable_thinking=False)


REWRITES = "{{ messages[-1].content }}{{ eos_token }}{% if add_generation_prompt %}A:{% endif %}"
"""A template that writes the last message only: an episode's earlier turns vanish."""


def test_episodes_refuse_a_template_their_continuation_cannot_follow():
    """A checkpoint's template with no stop token after a reply, or one that rewrites earlier
    turns as an episode grows, is one line; Qwen3's (built in, or an export's) and the plain
    format pass."""
    no_stop = dataclasses.replace(load_qwen3(), chat_template=ChatTemplate.from_jinja(
        CHAR_TEMPLATE, eos_token="<eos>"))
    with pytest.raises(UserError, match="own chat template: the chat template ends a reply "
                                        "with '<eos>"):
        check_turn_template(TurnFormat(no_stop, chat=True, thinking=False))
    rewrites = dataclasses.replace(load_qwen3(), chat_template=ChatTemplate.from_jinja(
        REWRITES, eos_token="<|im_end|>"))
    with pytest.raises(UserError, match="writes earlier turns differently"):
        check_turn_template(TurnFormat(rewrites, chat=True, thinking=False))
    check_turn_template(TurnFormat(no_stop, chat=False, thinking=False))
    for tok in (dataclasses.replace(load_char(), chat_template=ChatTemplate.qwen3()),
                load_char()):
        check_turn_template(TurnFormat(tok, chat=True, thinking=False))


def test_host_work_encodes_prompts_with_the_tokenizers_template():
    tok = _char_with_template()
    plan = SimpleNamespace(
        batch=SimpleNamespace(group_size=1, max_prompt_len=16),
        workload=SimpleNamespace(enable_thinking=False, chat_template=True,
                                 prompt_template="{question}"))
    work = HostWork(plan, tok, scorer=None)
    rows = [Problem("a/0", "2+3?", "5"), Problem("a/1", "x", "7", messages=(("user", "1+1?"),))]
    prompts = work.encode(rows)
    want = [tok.encode("Q: 2+3?\nA:"), tok.encode("Q: 1+1?\nA:")]
    for ids, n, w in zip(prompts.ids_BxP, prompts.len_B, want, strict=True):
        assert ids[-n:].tolist() == w
    assert np.all(prompts.ids_BxP[1, :-len(want[1])] == tok.pad_id)


LLAMA32_DATED = LLAMA3.replace("{%- if not date_string is defined %}\n    {%- set date_string "
                               "= '26 Jul 2024' %}",
                               "{%- if not date_string is defined %}\n    {%- set date_string "
                               "= strftime_now('%d %b %Y') %}")
"""In the style of Llama 3.2's template: today's date in the system header."""


def test_an_episode_continues_across_midnight(monkeypatch):
    """A template that writes `strftime_now` (Llama 3.2/3.3) renders one date for the whole
    run: the turns found before midnight continue after it (issue 60, item 6)."""
    from locojax.tokenizers import jinja_chat

    assert "strftime_now" in LLAMA32_DATED
    tok = dataclasses.replace(_llama_tokenizer(), chat_template=ChatTemplate.from_jinja(
        LLAMA32_DATED, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"))
    fmt = TurnFormat(tok, chat=True, thinking=False)
    check_turn_template(fmt)
    tomorrow = datetime.datetime.now() + datetime.timedelta(days=1)

    class Tomorrow(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return tomorrow

    monkeypatch.setattr(jinja_chat, "datetime", Tomorrow)
    more = fmt.after_reply([{"role": "user", "content": "Higher."}])
    assert tok.decode(more, skip_special=False).endswith("assistant<|end_header_id|>\n\n")

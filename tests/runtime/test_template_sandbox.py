"""Issue 62, item 4: a checkpoint's chat template renders only in the sandbox. One that reaches
for Python's internals (`cycler.__init__.__globals__`, `__class__.__mro__`, attribute access to
`os`, also through `attr()` or `map(attribute=...)`) is refused in one line naming its file
when the checkpoint's tokenizer is loaded (before any step), with nothing of it run; one that
renders forever or makes megabytes is stopped at a bound, when it is loaded (its first
render) or, for a conversation that sets it off later, in one line while the run renders it."""

import json
import re
import time

import pytest

from locojax.runtime.errors import UserError
from locojax.runtime.turns import TurnFormat
from locojax.tokenizers.char import load_char
from locojax.tokenizers.hf_dir import load_checkpoint, save_checkpoint_tokenizer
from locojax.tokenizers.jinja_chat import ChatTemplate, render_jinja
from locojax.tokenizers.template_guard import MAX_TEXT

PLAIN = "{% for m in messages %}{{ m.content }}\n{% endfor %}"
REACHES = [
    "{{ cycler.__init__.__globals__.os.popen('touch {flag}').read() }}",
    "{{ joiner.__init__.__globals__['os'].system('touch {flag}') }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__ }}",
    "{{ namespace.__init__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ messages['__class__'] }}",
    "{{ range.os.system('touch {flag}') }}",
    "{{ cycler|attr('__init__') }}",
    "{{ messages|map(attribute='__class__')|list }}",
    "{% if messages %}{{ (messages|first).gi_frame.f_globals }}{% endif %}",
    PLAIN + "{% if tools %}{{ tools.__class__ }}{% endif %}",  # not on the probe's path
]
BOUNDED = {
    "nested ranges": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                     "{% endfor %}",
    "nested loops, no call": "{% set xs = range(50000)|list %}{% for a in xs %}{% for b in xs %}"
                             "{% endfor %}{% endfor %}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "a repeated text": "{{ 'x' * 100000000 }}",
    "a wide filter": "{{ 'x'|center(100000000) }}",
    "a wide format": "{{ '%0999999999d'|format(1) }}",
    "a wide str.format": "{{ '{:>999999999}'.format(1) }}",
    "a doubling namespace": "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "a doubling macro": "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% else %}{{ s }}"
                        "{% endif %}{% endmacro %}{{ d('x', 40) }}",
    "megabytes of output": "{% for i in range(300000) %}xxxxxxxxxx{% endfor %}",
    "a big power": "{{ 10 ** 100000000 }}",
}


def _checkpoint(path, template: str) -> None:
    save_checkpoint_tokenizer(load_char(), path)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps(cfg | {"chat_template": template}))


@pytest.mark.parametrize("template", REACHES)
def test_a_template_reaching_for_internals_is_refused_naming_its_file(tmp_path, template):
    flag = tmp_path / "ran"
    _checkpoint(tmp_path, template.replace("{flag}", str(flag)))
    with pytest.raises(ValueError) as err:
        load_checkpoint(tmp_path)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{tmp_path / 'tokenizer_config.json'}: ")
    assert re.search(r"reaches for Python's internals \(line \d: `\w+`\); refused", line), line
    assert not flag.exists()


@pytest.mark.parametrize("what", BOUNDED)
def test_a_template_that_renders_forever_or_makes_megabytes_is_stopped(tmp_path, what):
    (tmp_path / "chat_template.jinja").write_text(BOUNDED[what])
    _checkpoint(tmp_path, PLAIN)
    start = time.monotonic()
    with pytest.raises(ValueError) as err:
        load_checkpoint(tmp_path)
    assert time.monotonic() - start < 10
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{tmp_path / 'chat_template.jinja'}: chat "
                                                "template")


def test_a_bound_met_later_in_a_run_is_one_line():
    late = "{% for m in messages %}{{ m.content * (1000000 if m.role == 'tool' else 1) }}" \
           "{% endfor %}"
    tok = load_char("ascii")
    fmt = TurnFormat(tok.__class__(**{**tok.__dict__,
                                      "chat_template": ChatTemplate.from_jinja(late)}),
                     chat=True, thinking=False)
    assert fmt.opening_text([{"role": "user", "content": "hi"}]) == "hi"
    with pytest.raises(UserError, match="chat template: the template") as err:
        fmt.opening([{"role": "tool", "content": "hi"}])
    assert "\n" not in str(err.value)


def test_a_name_built_at_render_reaches_nothing(tmp_path):
    """A name the syntax tree does not show is the sandbox's to refuse: it gives nothing."""
    flag = tmp_path / "ran"
    sneaky = ("{{ (cycler|attr('__in' ~ 'it__')|attr('__glob' ~ 'als__'))['o' ~ 's'].system("
              f"'touch {flag}') }}}}" + PLAIN)
    with pytest.raises(ValueError, match="^chat template: .*Undefined") as err:
        render_jinja(sneaky, [{"role": "user", "content": "hi"}])
    assert "\n" not in str(err.value) and not flag.exists()


def test_an_ordinary_template_renders_as_before():
    assert render_jinja(PLAIN, [{"role": "user", "content": "x" * (MAX_TEXT // 2)}]).startswith(
        "xxx")
    looped = "{% for i in range(1000) %}{{ i }},{% endfor %}"
    assert render_jinja(looped, []).count(",") == 1000

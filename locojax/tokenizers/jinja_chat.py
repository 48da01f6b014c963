"""Chat templates as the field renders them: a checkpoint's own Jinja text, or Qwen3's in Python.

    tokenizer_config.json `chat_template` | chat_template.jinja   (hf_dir.load_checkpoint)
        ──ChatTemplate.from_jinja: compiled once per text in jinja2's immutable sandbox──>
    ChatTemplate ──render(messages, tools, add_generation_prompt, enable_thinking)──> text
        jinja None (ChatTemplate.qwen3()) ──chat.apply_chat_template (hand-written)──> text
        jinja text ──render_jinja──> text

The environment is the one transformers' `apply_chat_template` renders in: an
`ImmutableSandboxedEnvironment` with `trim_blocks`, `lstrip_blocks` and loop controls
(`{% break %}`, `{% continue %}`); a `tojson` filter that is `json.dumps` keeping non-ASCII
(`indent`, `separators`, `sort_keys` optional) instead of Jinja's HTML-escaping one;
`raise_exception(message)` and `strftime_now(format)`. A template sees `messages`, `tools`,
`add_generation_prompt`, `enable_thinking` and the special token strings it is given
(`bos_token`, `eos_token`; one left out or None is undefined, as in transformers).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2.ext import loopcontrols

from locojax.tokenizers.chat import CHAT_TEMPLATE_JINJA, apply_chat_template
from locojax.tokenizers.template_guard import GuardedEnvironment, check_template


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """The `tojson` filter: plain JSON text, non-ASCII kept, no HTML escaping."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    """`raise_exception(message)` in a template: a ValueError with the template's message."""
    raise ValueError(message)


_STARTED = datetime.now()
"""The time `strftime_now` gives: this process's start, one date for the whole run (a
template that writes today's date, as Llama 3.2's does, renders an episode's turns alike
across midnight, so its transcript still continues)."""


def _strftime_now(fmt: str) -> str:
    """`strftime_now(format)` in a template: the local time the process started, formatted."""
    return _STARTED.strftime(fmt)


@functools.cache
def _environment() -> GuardedEnvironment:
    """The sandboxed Jinja environment every template compiles in (built once; every render
    bounded: `template_guard`)."""
    env = GuardedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _cause(err: BaseException) -> str:
    """One line naming what went wrong (a syntax error with its template line)."""
    text = str(getattr(err, "message", None) or err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    line = getattr(err, "lineno", None)
    return f"line {line}: {first}" if isinstance(line, int) else first


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> Any:
    """`template` compiled (once per text). Raises ValueError naming why it does not compile,
    or reaches for Python's internals, or meets a bound on a first render
    (`template_guard.check_template`)."""
    env = _environment()
    try:
        compiled = env.from_string(template)
    except Exception as err:  # TemplateSyntaxError, mostly; any failure is the template's
        raise ValueError(f"chat template does not compile: {_cause(err)}") from None
    check_template(env, template, compiled)  # issue 62: internals, and a bounded first render
    return compiled


def render_jinja(template: str, messages: Sequence[Mapping[str, Any]],
                 add_generation_prompt: bool = True, enable_thinking: bool = True,
                 tools: Sequence[Mapping[str, Any]] | None = None,
                 **special_tokens: str | None) -> str:
    """`messages` (dicts with `role` and `content`) and `tools` (schemas) rendered by the Jinja
    `template` as transformers renders it; `special_tokens` (e.g. `bos_token="<s>"`) are
    variables of the template, a None one left undefined.

    Raises ValueError in one line when the template does not compile, calls
    `raise_exception(message)` (the message), breaks the sandbox (e.g. reads `__class__`) or
    fails otherwise while it renders."""
    compiled = _compile(template)
    tokens = {name: value for name, value in special_tokens.items() if value is not None}
    try:
        return _environment().render_bounded(
            compiled, messages=list(messages), tools=None if tools is None else list(tools),
            add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking,
            **tokens)
    except Exception as err:  # the template is code: whatever it raises is its failure
        raise ValueError(f"chat template: {_cause(err)}") from err


@dataclass(frozen=True)
class ChatTemplate:
    """How a tokenizer turns messages into the text of a prompt.

    `jinja` None is Qwen3's template, rendered by the hand-written `chat.apply_chat_template`
    (the fast path); a Jinja text is rendered by `render_jinja` with the token strings below.
    """

    jinja: str | None = None
    """The template's Jinja text; None: Qwen3's, in Python."""
    bos_token: str | None = None
    """`bos_token` as the template sees it (None: undefined)."""
    eos_token: str | None = None
    """`eos_token` as the template sees it (None: undefined)."""

    @classmethod
    def qwen3(cls) -> ChatTemplate:
        """Qwen3's template, rendered in Python (no Jinja)."""
        return cls()

    @classmethod
    def from_jinja(cls, text: str, bos_token: str | None = None,
                   eos_token: str | None = None) -> ChatTemplate:
        """The template of Jinja `text`, compiled now. Qwen3's own text as LoCoJAX writes it
        (`chat.CHAT_TEMPLATE_JINJA`, what an export carries) takes the Python fast path, which
        renders the same. Raises ValueError (one line) when `text` does not compile."""
        if text == CHAT_TEMPLATE_JINJA:
            return cls.qwen3()
        _compile(text)
        return cls(jinja=text, bos_token=bos_token, eos_token=eos_token)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               enable_thinking: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The text of `messages` and `tools`, ending with the generation prompt when
        `add_generation_prompt`. Raises ValueError when the template refuses the messages (an
        unknown role for Qwen3's; `raise_exception` or any failure for a Jinja one)."""
        if self.jinja is None:
            return apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                       enable_thinking=enable_thinking, tools=tools)
        return render_jinja(self.jinja, messages, add_generation_prompt=add_generation_prompt,
                            enable_thinking=enable_thinking, tools=tools,
                            bos_token=self.bos_token, eos_token=self.eos_token)

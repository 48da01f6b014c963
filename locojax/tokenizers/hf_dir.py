"""Tokenizer of a local Hugging Face checkpoint directory (`tokenizer.json` + config files).

    tokenizer.json ─────────────────────────────────> backend
    generation_config.json, tokenizer_config.json ──> eos, pad, bos, stops
    chat_template.jinja | tokenizer_config.json `chat_template` ──> ChatTemplate (Jinja)

`load_checkpoint` reads one; `save_checkpoint_tokenizer` writes any LoCoJAX tokenizer as one, so
HF `AutoTokenizer`, tunix and TRL read the same ids (the GRPO benchmark hands its checkpoints
to them this way).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers as tk

from locojax.tokenizers.base import Tokenizer
from locojax.tokenizers.jinja_chat import ChatTemplate

TEMPLATE_FILE = "chat_template.jinja"
"""The chat template beside tokenizer_config.json (transformers >= 4.43 may write it there);
when present it is the one used, as in transformers."""


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of the checkpoint ({} when absent); ValueError naming the file when
    it cannot be read or is not a JSON object."""
    if not path.exists():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot read it as JSON ({err})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return value


def _backend(path: Path) -> tk.Tokenizer:
    """The `tokenizers` backend of `tokenizer.json`; ValueError naming the file when it cannot
    be read or parsed (the library's own error is a bare `Exception`)."""
    try:
        return tk.Tokenizer.from_str(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot read it ({err})") from None
    except Exception as err:  # noqa: BLE001 - tokenizers raises plain Exception
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"{path}: not a tokenizer file ({first})") from None


def _token_ids(value: Any) -> list[int]:
    """`eos_token_id`-style value (int, list of ints or null) as a list."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _token_string(value: Any) -> str | None:
    """Text of a tokenizer_config token entry: a string or `{"content": ...}` (else None)."""
    content = value.get("content") if isinstance(value, dict) else value
    return content if isinstance(content, str) else None


def _token_string_id(backend: tk.Tokenizer, value: Any) -> int | None:
    """Id of a tokenizer_config token entry: a string or `{"content": ...}`."""
    content = _token_string(value)
    return backend.token_to_id(content) if content is not None else None


def _template_text(root: Path, tcfg: dict[str, Any]) -> tuple[str, Path] | None:
    """(Jinja text, file it is in) of the checkpoint's chat template, None when it has none:
    `chat_template.jinja`, else tokenizer_config.json's `chat_template`, a string or named
    templates `[{"name": ..., "template": ...}]` of which "default" is taken. ValueError naming
    the file when it cannot be read or has no usable template."""
    jinja = root / TEMPLATE_FILE
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8"), jinja
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{jinja}: cannot read it ({err})") from None
    path, value = root / "tokenizer_config.json", tcfg.get("chat_template")
    if value is None or isinstance(value, str):
        return None if value is None else (value, path)
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"], path
        raise ValueError(f"{path}: chat_template names no 'default' template "
                         f"(names: {sorted(str(n) for n in named)})")
    raise ValueError(f"{path}: chat_template is a {type(value).__name__}, not a Jinja string "
                     "or a list of named templates")


def _chat_template(root: Path, tcfg: dict[str, Any]) -> ChatTemplate | None:
    """The checkpoint's own chat template, compiled, with tokenizer_config's bos and eos
    strings; None when it has none. ValueError naming the file when it does not compile."""
    found = _template_text(root, tcfg)
    if found is None:
        return None
    text, path = found
    try:
        return ChatTemplate.from_jinja(text, bos_token=_token_string(tcfg.get("bos_token")),
                                       eos_token=_token_string(tcfg.get("eos_token")))
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def load_checkpoint(checkpoint_dir: str | Path) -> Tokenizer:
    """Tokenizer of `checkpoint_dir`; eos, pad and stops from generation/tokenizer configs.

    eos: tokenizer_config `eos_token`, else the first generation_config `eos_token_id`.
    stops: all generation_config eos ids, then eos. pad: generation_config `pad_token_id`,
    else tokenizer_config `pad_token`, else eos. chat_template: the checkpoint's own
    (`_template_text`), None when it has none. Raises FileNotFoundError without tokenizer.json;
    ValueError naming the file for an unreadable file, no eos, or a template that does not
    compile.
    """
    root = Path(checkpoint_dir)
    path = root / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in checkpoint directory {root}")
    backend = _backend(path)
    gen = _read_json(root / "generation_config.json")
    tcfg = _read_json(root / "tokenizer_config.json")

    gen_eos = _token_ids(gen.get("eos_token_id"))
    eos = _token_string_id(backend, tcfg.get("eos_token"))
    if eos is None:
        eos = gen_eos[0] if gen_eos else None
    if eos is None:
        raise ValueError(
            f"checkpoint {root}: no eos token in generation_config.json (eos_token_id) "
            "or tokenizer_config.json (eos_token)"
        )
    pad_ids = _token_ids(gen.get("pad_token_id"))
    pad = pad_ids[0] if pad_ids else _token_string_id(backend, tcfg.get("pad_token"))
    bos_ids = _token_ids(gen.get("bos_token_id"))
    bos = bos_ids[0] if bos_ids else _token_string_id(backend, tcfg.get("bos_token"))
    return Tokenizer(
        backend=backend,
        name=str(root),
        eos_id=eos,
        pad_id=eos if pad is None else pad,
        stop_ids=tuple(dict.fromkeys([*gen_eos, eos])),
        bos_id=bos,
        chat_template=_chat_template(root, tcfg),
        prompt_bos=_added_start(backend),
    )


def _added_start(backend) -> int | None:
    """The one id the backend's post-processor puts before a text (Llama 3, Gemma), else
    None (Qwen's adds nothing; one that adds anything else is not a start token)."""
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    return full[0] if len(full) == len(plain) + 1 and full[1:] == plain else None


def has_chat_tokens(tok: Tokenizer) -> bool:
    """Whether the vocabulary holds the chat template's turn markers (Qwen3's, not char's)."""
    return all(tok.backend.token_to_id(t) is not None for t in ("<|im_start|>", "<|im_end|>"))


def save_checkpoint_tokenizer(tok: Tokenizer, out_dir: str | Path, *,
                              chat_template: str | None = None,
                              generation: dict[str, Any] | None = None) -> Path:
    """Write `tok` as the tokenizer files of a checkpoint that `load_checkpoint` and HF read.

    tokenizer.json (the backend), tokenizer_config.json (eos, pad, unk; `chat_template` when
    given), special_tokens_map.json and generation_config.json (every stop id as
    `eos_token_id`, so HF `generate` stops where LoCoJAX does, then `generation`: sampling
    defaults). No bos token is declared (LoCoJAX never adds one, and readers such as tunix's
    sampler prepend a declared one); HF's clean-up of spaces before punctuation is off, so
    decoded text is the backend's own.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.backend.save(str(out / "tokenizer.json"))
    special = {"eos_token": tok.backend.id_to_token(tok.eos_id),
               "pad_token": tok.backend.id_to_token(tok.pad_id)}
    if tok.unk_id is not None:
        special["unk_token"] = tok.backend.id_to_token(tok.unk_id)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    _write_json(out / "tokenizer_config.json", config)
    _write_json(out / "special_tokens_map.json", special)
    _write_json(out / "generation_config.json", {"eos_token_id": list(tok.stop_ids),
                                                 "pad_token_id": tok.pad_id,
                                                 **(generation or {})})
    return out


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")

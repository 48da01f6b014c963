"""The one tokenizer interface of LoCoJAX: a frozen wrapper over a Rust `tokenizers.Tokenizer`.

    text ──encode / batch_encode──> ids ──decode / batch_decode──> text
    prompt text ──encode_prompts──> ids, behind the checkpoint's own start token (Llama 3's
        <|begin_of_text|>, Gemma's <bos>) where its tokenizer puts one before every text
    messages, tools ──chat (its own ChatTemplate, else Qwen3's in Python)──> text
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tokenizers as tk

from locojax.tokenizers.jinja_chat import ChatTemplate

_QWEN3_CHAT = ChatTemplate.qwen3()


def _as_ints(ids: Iterable[int]) -> list[int]:
    """Plain Python ints (numpy and JAX arrays arrive here from the rollout)."""
    tolist = getattr(ids, "tolist", None)
    return tolist() if tolist is not None else [int(i) for i in ids]


@dataclass(frozen=True)
class Tokenizer:
    """Text <-> token ids; every kind (qwen, checkpoint, char, bpe) is one of these.

    Ids at or past `vocab_size` (a model's padded vocabulary) decode to nothing.
    """

    backend: tk.Tokenizer
    """The Rust tokenizer doing the work (batch calls release the GIL)."""
    name: str
    """Where it came from, e.g. `qwen3`, `char`, `bpe-8192-<hash>`, a checkpoint path."""
    eos_id: int
    """Token appended to training targets and ending a turn."""
    pad_id: int
    """Token used to pad batches (masked out everywhere)."""
    stop_ids: tuple[int, ...]
    """Any of these ends a completion in the rollout."""
    bos_id: int | None = None
    """Start token, if the vocabulary has one; added only as `prompt_bos`."""
    unk_id: int | None = None
    """Set when the vocabulary is closed (char): producing it makes `encode` raise."""
    chat_template: ChatTemplate | None = None
    """The checkpoint's own chat template; None: none of its own, `chat` renders Qwen3's."""
    prompt_bos: int | None = None
    """The id a checkpoint's tokenizer puts before every text it encodes (its post-processor:
    what transformers' `tokenizer(text)` adds), which its model was trained behind; prompts
    start with it (`encode_prompts`). None (Qwen, char, bpe): prompts are the text's ids."""

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (the model may pad past it)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in the text map to their ids."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if self.unk_id is not None and self.unk_id in ids:
            self._raise_unknown(text)
        return ids

    def batch_encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, in one Rust call."""
        encs = self.backend.encode_batch_fast(list(texts), add_special_tokens=False)
        out = [e.ids for e in encs]
        if self.unk_id is not None:
            for text, ids in zip(texts, out, strict=True):
                if self.unk_id in ids:
                    self._raise_unknown(text)
        return out

    def encode_prompts(self, texts: Sequence[str]) -> list[list[int]]:
        """`batch_encode`, each behind `prompt_bos` unless its text already starts with it (a
        chat template that writes the start token)."""
        out = self.batch_encode(texts)
        bos = self.prompt_bos
        if bos is None:
            return out
        return [ids if ids[:1] == [bos] else [bos, *ids] for ids in out]

    def keep_end(self, ids: list[int], width: int) -> list[int]:
        """The last `width` of a prompt's ids (a prompt too long for the plan is cut on the
        left), its `prompt_bos` kept in front."""
        if len(ids) <= width:
            return ids
        if self.prompt_bos is not None and ids[:1] == [self.prompt_bos] and width > 1:
            return [self.prompt_bos, *ids[len(ids) - width + 1:]]
        return ids[len(ids) - width:]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of `ids`; `skip_special` drops tokens flagged special (not `<think>` in Qwen3)."""
        return self.backend.decode(_as_ints(ids), skip_special_tokens=skip_special)

    def batch_decode(self, seqs: Iterable[Iterable[int]], skip_special: bool = True) -> list[str]:
        """Text of each id sequence, in one Rust call."""
        lists = [_as_ints(s) for s in seqs]
        return self.backend.decode_batch(lists, skip_special_tokens=skip_special)

    def chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
             enable_thinking: bool = True,
             tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """`messages` and `tools` as prompt text, by `chat_template` (Qwen3's, in Python, when
        None). Raises ValueError when the template refuses them."""
        template = _QWEN3_CHAT if self.chat_template is None else self.chat_template
        return template.render(messages, add_generation_prompt=add_generation_prompt,
                               enable_thinking=enable_thinking, tools=tools)

    def token_id(self, token: str) -> int:
        """Id of one token string (e.g. `<|im_end|>`); KeyError if absent."""
        i = self.backend.token_to_id(token)
        if i is None:
            raise KeyError(f"token {token!r} is not in tokenizer {self.name!r}")
        return i

    def unknown_characters(self, texts: Sequence[str]) -> list[tuple[int, list[str]]]:
        """(index, the characters it cannot encode) of each text this tokenizer cannot encode
        whole (none for a byte-level one, which has no unknown id)."""
        if self.unk_id is None:
            return []
        alphabet = set(self._alphabet())
        if not set().union(*texts) - alphabet:  # every character a token: all encode
            return []
        # Only a text with a character outside the single-character tokens can fail; encoding
        # it says whether a longer token covers that character after all.
        out = []
        for i, text in enumerate(texts):
            odd = set(text) - alphabet
            if odd and self.unk_id in self.backend.encode(text, add_special_tokens=False).ids:
                out.append((i, sorted(odd)))
        return out

    def _alphabet(self) -> str:
        return "".join(sorted(t for t in self.backend.get_vocab() if len(t) == 1))

    def _raise_unknown(self, text: str) -> None:
        alphabet = self._alphabet()
        unknown = sorted({c for c in text if c not in alphabet})
        raise ValueError(
            f"tokenizer {self.name!r} cannot encode characters {unknown!r} "
            f"(text {text[:60]!r}); its alphabet is {alphabet!r}"
        )

"""`load_tokenizer`: one entry point over the tokenizer kinds."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from locojax.tokenizers.base import Tokenizer
from locojax.tokenizers.bpe import DEFAULT_BPE_VOCAB, load_bpe
from locojax.tokenizers.char import ALPHABETS, load_char
from locojax.tokenizers.hf_dir import load_checkpoint
from locojax.tokenizers.qwen import load_qwen3

KINDS = ("qwen", "checkpoint", "char", "ascii", "bpe")
"""Tokenizer kinds; the values of the config schema's `TokenizerKind`."""


def load_tokenizer(
    kind: str,
    *,
    checkpoint_dir: str | Path | None = None,
    train_texts: Iterable[str] | None = None,
    vocab_size: int | None = None,
    source_id: str | None = None,
) -> Tokenizer:
    """Tokenizer of `kind`.

    `vocab_size` is the model's vocabulary: for `bpe` the training target (default 8192),
    for the other kinds a bound the tokenizer's ids must fit under (checked).
    `train_texts` and `source_id` (cache key of the text source) are for `bpe` only.
    """
    if kind == "bpe":
        if train_texts is None:
            raise ValueError("tokenizer kind 'bpe' needs train_texts")
        return load_bpe(train_texts, vocab_size or DEFAULT_BPE_VOCAB, source_id)
    if kind == "qwen":
        tok = load_qwen3()
    elif kind in ALPHABETS:
        tok = load_char(kind)
    elif kind == "checkpoint":
        if checkpoint_dir is None:
            raise ValueError("tokenizer kind 'checkpoint' needs checkpoint_dir (model.checkpoint)")
        tok = load_checkpoint(checkpoint_dir)
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {KINDS}")
    if vocab_size is not None and tok.vocab_size > vocab_size:
        raise ValueError(
            f"tokenizer {tok.name!r} has {tok.vocab_size} ids but the model vocab_size is "
            f"{vocab_size}"
        )
    if vocab_size is not None and kind == "checkpoint":  # the built-in ones are the package's
        _check_ids(tok, vocab_size)
    return tok


def _check_ids(tok: Tokenizer, vocab_size: int) -> None:
    """ValueError naming the first id of `tok` (a token's, or its eos, pad, bos or stop id) at
    or past `vocab_size`: the model has no row for it (its embedding would be read out of
    range)."""
    vocab = tok.backend.get_vocab(with_added_tokens=True)
    token, top = max(vocab.items(), key=lambda kv: kv[1], default=("", -1))
    if top >= vocab_size:
        raise ValueError(f"tokenizer {tok.name!r}: token {token!r} has id {top}, past the "
                         f"model's vocab_size {vocab_size}")
    special = [("eos", tok.eos_id), ("pad", tok.pad_id), ("bos", tok.bos_id),
               *(("stop", i) for i in tok.stop_ids)]
    for what, i in special:
        if i is not None and not 0 <= i < vocab_size:
            raise ValueError(f"tokenizer {tok.name!r}: its {what} id {i} is outside the "
                             f"model's vocab_size {vocab_size}")

"""Byte-level BPE plumbing shared by the Qwen3 and trained BPE tokenizers."""

from __future__ import annotations

import functools

import tokenizers as tk
from tokenizers import Regex, decoders, normalizers, pre_tokenizers

QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2/Qwen3 pre-tokenizer regex: contractions, words, single digits, punctuation, spaces."""


@functools.cache
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 bytes to printable characters (byte-level BPE)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    # Unprintable bytes go, in byte order, to the code points after 255.
    rest = [b for b in range(256) if b not in table]
    table.update({b: chr(256 + n) for n, b in enumerate(rest)})
    return table


def bytes_to_token(b: bytes) -> str:
    """The byte-level string naming a token of raw bytes `b`."""
    table = byte_to_unicode()
    return "".join(table[x] for x in b)


def byte_level_pipeline(tok: tk.Tokenizer) -> tk.Tokenizer:
    """Set Qwen's text pipeline on `tok`: NFC, the Qwen split regex, ByteLevel and its decoder."""
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok

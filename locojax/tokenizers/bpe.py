"""A small byte-level BPE trained on a workload's own text, cached on disk.

Same text pipeline as Qwen3 (NFC, Qwen split regex, single digits, byte level), so any text
encodes without unknowns. Ids: <|endoftext|>=0 (pad), <|im_start|>=1, <|im_end|>=2 (eos),
then the learned tokens, then `<think>` and `</think>` as the last two ids (added, not special,
as in Qwen3), so the chat template works with it too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import tokenizers as tk
from tokenizers import AddedToken, models, pre_tokenizers, trainers

from locojax.tokenizers.base import Tokenizer
from locojax.tokenizers.byte_level import byte_level_pipeline
from locojax.tokenizers.cache import cached_tokenizer

BPE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Special tokens, ids 0..2."""
BPE_ADDED = ("<think>", "</think>")
"""Plain added tokens, the last two ids."""
DEFAULT_BPE_VOCAB = 8192
_FORMAT = 1  # bump when training settings change, to invalidate caches


def train_bpe(texts: Iterable[str], vocab_size: int = DEFAULT_BPE_VOCAB) -> tk.Tokenizer:
    """Train a byte-level BPE of at most `vocab_size` ids on `texts`."""
    floor = len(BPE_SPECIALS) + len(BPE_ADDED) + 256
    if vocab_size < floor:
        raise ValueError(f"bpe vocab_size={vocab_size} is below the {floor} fixed ids")
    tok = byte_level_pipeline(tk.Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(BPE_ADDED),
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in BPE_SPECIALS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in BPE_ADDED])
    return tok


def _texts_digest(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()


def load_bpe(
    texts: Iterable[str], vocab_size: int = DEFAULT_BPE_VOCAB, source_id: str | None = None
) -> Tokenizer:
    """Trained BPE for `texts`, cached by (source_id, vocab_size, tokenizers version).

    `source_id` names the text source (e.g. `gsm8k/train`); it must change when the text does.
    Without it the texts are read in full and their content hash is the source id.
    """
    if source_id is None:
        texts = list(texts)
        source_id = "sha256:" + _texts_digest(texts)
    key = f"{source_id}|{vocab_size}|{tk.__version__}|{_FORMAT}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    name = f"bpe-{vocab_size}-{digest}"
    backend = cached_tokenizer(f"{name}.json", lambda: train_bpe(texts, vocab_size))
    im_end, endoftext = backend.token_to_id("<|im_end|>"), backend.token_to_id("<|endoftext|>")
    return Tokenizer(
        backend=backend, name=name, eos_id=im_end, pad_id=endoftext, stop_ids=(im_end, endoftext)
    )

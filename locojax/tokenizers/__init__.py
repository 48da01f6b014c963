"""Tokenizers behind one interface: real Qwen3 (offline), HF checkpoints, char-level, small BPE."""

from locojax.tokenizers.base import Tokenizer
from locojax.tokenizers.chat import apply_chat_template
from locojax.tokenizers.hf_dir import save_checkpoint_tokenizer
from locojax.tokenizers.load import KINDS, load_tokenizer

__all__ = [
    "KINDS",
    "Tokenizer",
    "apply_chat_template",
    "load_tokenizer",
    "save_checkpoint_tokenizer",
]

"""Character-level tokenizer with a tiny fixed alphabet, for the `arith` workload on CPU.

Ids (29 in all; a model may pad its vocabulary past them, e.g. to 32):

    0 <pad>   1 <bos>   2 <eos>   3 <unk>
    4..13   the digits 0 1 2 3 4 5 6 7 8 9
    14..18  + - * / =
    19..26  space, newline, # ? . : ( )
    27..28  Q A

Every character is one token. Text with any other character makes `encode` raise ValueError
naming the characters, so a workload whose prompts leave this alphabet fails loudly.
"""

from __future__ import annotations

import functools

import tokenizers as tk
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from locojax.tokenizers.base import Tokenizer

CHAR_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
"""Special tokens, ids 0..3."""
CHAR_ALPHABET = "0123456789+-*/= \n#?.:()QA"
"""The characters, ids 4.. in this order."""


def build_char() -> tk.Tokenizer:
    """WordLevel over single characters; the Fuse decoder joins them back without spaces."""
    vocab = {t: i for i, t in enumerate((*CHAR_SPECIALS, *CHAR_ALPHABET))}
    tok = tk.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAR_SPECIALS])
    return tok


@functools.cache
def load_char() -> Tokenizer:
    """The `char` tokenizer: <pad>=0, <bos>=1, <eos>=2, stops on <eos>."""
    return Tokenizer(
        backend=build_char(),
        name="char",
        eos_id=2,
        pad_id=0,
        stop_ids=(2,),
        bos_id=1,
        unk_id=3,
    )

"""Character-level tokenizers with small fixed alphabets, for the `arith` workloads on CPU.

`char` (29 ids in all; a model may pad its vocabulary past them, e.g. to 32):

    0 <pad>   1 <bos>   2 <eos>   3 <unk>
    4..13   the digits 0 1 2 3 4 5 6 7 8 9
    14..18  + - * / =
    19..26  space, newline, # ? . : ( )
    27..28  Q A

`ascii` (100 ids): the same specials, then the 95 printable ASCII characters (space to `~`)
and the newline: room for the plain turn format (`envs.turns`) and Qwen3's tool calls
(`<tool_call>{"name": ...}`) in the tool demo (`+experiment=arith_tools_co`).

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
ALPHABETS = {"char": CHAR_ALPHABET, "ascii": "".join(map(chr, range(32, 127))) + "\n"}
"""Each character-level tokenizer's characters, ids 4.. in this order."""


def build_char(name: str = "char") -> tk.Tokenizer:
    """WordLevel over single characters; the Fuse decoder joins them back without spaces."""
    vocab = {t: i for i, t in enumerate((*CHAR_SPECIALS, *ALPHABETS[name]))}
    tok = tk.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAR_SPECIALS])
    return tok


@functools.cache
def load_char(name: str = "char") -> Tokenizer:
    """The character-level tokenizer `name` (`ALPHABETS`): <pad>=0, <bos>=1, <eos>=2, stops on
    <eos>. Raises KeyError for another name."""
    return Tokenizer(
        backend=build_char(name),
        name=name,
        eos_id=2,
        pad_id=0,
        stop_ids=(2,),
        bos_id=1,
        unk_id=3,
    )

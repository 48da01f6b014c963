"""Char-level and trained BPE tokenizers, the disk cache, checkpoint configs and the chat template."""

import json
import os
import pickle
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
import tokenizers as tk
from paths import DATA, ROOT

from compiler.config import TokenizerKind
from locojax.tokenizers import KINDS, Tokenizer, apply_chat_template, load_tokenizer
from locojax.tokenizers.bpe import train_bpe
from locojax.tokenizers.cache import cache_dir, cached_tokenizer
from locojax.tokenizers.char import CHAR_ALPHABET

SMALL_TEXTS = [
    f"{a}+{b}={a + b}\n#### {a + b} apples and pears" for a in range(30) for b in range(9)
]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCOJAX_CACHE_DIR", str(tmp_path / "cache"))


def _jsonl(path, *fields):
    if not path.is_file():
        pytest.skip(f"{path} not found (set LOCOJAX_DATA_DIR)")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r[f] for r in rows for f in fields]


def _never_iterated():
    raise AssertionError("training texts were read although the cache should have answered")
    yield ""


# --- char ------------------------------------------------------------------------------------


def test_char_layout_is_fixed():
    tok = load_tokenizer("char")
    assert tok.vocab_size == 29 <= 32
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id, tok.stop_ids) == (0, 1, 2, 3, (2,))
    assert tok.encode("0123456789") == list(range(4, 14))
    assert tok.encode(CHAR_ALPHABET) == list(range(4, 29))
    assert tok.encode("Q: 3+4=?\nA: #### 7") == [
        27, 24, 19, 7, 14, 8, 18, 22, 20, 28, 24, 19, 21, 21, 21, 21, 19, 11,
    ]  # fmt: skip


def test_ascii_carries_the_plain_turn_format_and_qwen3_tool_calls():
    """`ascii`: char's specials, then every printable ASCII character and the newline, one
    token each: a tool call and the plain format's role lines round-trip."""
    tok = load_tokenizer("ascii", vocab_size=128)
    assert tok.vocab_size == 100 and (tok.pad_id, tok.eos_id, tok.stop_ids) == (0, 2, (2,))
    text = ('System: Tools: add(a, b)\nUser: 123+456=\nAssistant: <tool_call>\n{"name": '
            '"add", "arguments": {"a": 123, "b": 456}}\n</tool_call>')
    ids = tok.encode(text)
    assert len(ids) == len(text) and max(ids) < 100 and tok.decode(ids) == text
    with pytest.raises(ValueError, match="é"):
        tok.encode("café")


def test_char_round_trip_and_padding_ids():
    tok = load_tokenizer("char", vocab_size=32)
    texts = ["12 + 7 * (3 - 1) = 26\n#### 26", "Q: 9/3=?", " \n\n  "]
    assert tok.batch_decode(tok.batch_encode(texts)) == texts
    ids = [tok.bos_id, *tok.encode("4+4=8"), tok.eos_id, tok.pad_id, 30, 31]
    assert tok.decode(np.array(ids)) == "4+4=8"
    assert tok.decode(ids, skip_special=False) == "<bos>4+4=8<eos><pad>"


def test_char_rejects_unknown_characters():
    tok = load_tokenizer("char")
    with pytest.raises(ValueError, match=r"\['a', 'h', 't', 'w'\]"):
        tok.encode("what 2+2")
    with pytest.raises(ValueError, match="cannot encode"):
        tok.batch_encode(["1+1", "1 + x"])
    with pytest.raises(ValueError, match="29 ids"):
        load_tokenizer("char", vocab_size=16)


# --- bpe -------------------------------------------------------------------------------------


def test_bpe_on_gsm8k_round_trips_unseen_text():
    train = _jsonl(DATA / "gsm8k" / "test.jsonl", "question", "answer")
    tok = load_tokenizer("bpe", train_texts=train, vocab_size=2048, source_id="gsm8k/test")
    assert tok.vocab_size == 2048
    assert [tok.token_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert (tok.token_id("<think>"), tok.token_id("</think>")) == (2046, 2047)
    assert (tok.eos_id, tok.pad_id, tok.stop_ids) == (2, 0, (2, 0))
    assert len(tok.encode("1234567")) == 7  # digits split one by one, as in Qwen
    assert sum(map(len, tok.batch_encode(train))) < 0.4 * sum(map(len, train))
    unseen = [t for t in _jsonl(DATA / "math500" / "test.jsonl", "problem", "solution")]
    unseen += ["emoji 😀 and 中文 and tabs\t\r\n", "<think>\nx\n</think>\n\n42<|im_end|>"]
    out = tok.batch_decode(tok.batch_encode(unseen), skip_special=False)
    assert out == [unicodedata.normalize("NFC", t) for t in unseen]
    assert tok.decode(tok.encode("<|im_start|>hi<think>")) == "hi<think>"


def test_bpe_cache_hit_skips_training():
    first = load_tokenizer("bpe", train_texts=iter(SMALL_TEXTS), vocab_size=300, source_id="s")
    again = load_tokenizer("bpe", train_texts=_never_iterated(), vocab_size=300, source_id="s")
    assert again.backend.get_vocab() == first.backend.get_vocab()
    other = load_tokenizer("bpe", train_texts=SMALL_TEXTS, vocab_size=268, source_id="s")
    assert other.vocab_size == 268 < first.vocab_size <= 300 and other.name != first.name
    assert sorted(p.name for p in cache_dir().iterdir()) == sorted(
        [f"{first.name}.json", f"{other.name}.json"]
    )
    # Without a source id the content is the key: same texts, same file.
    by_content = load_tokenizer("bpe", train_texts=iter(SMALL_TEXTS), vocab_size=300)
    same = load_tokenizer("bpe", train_texts=list(SMALL_TEXTS), vocab_size=300)
    assert same.name == by_content.name and same.backend.get_vocab() == first.backend.get_vocab()
    changed = load_tokenizer("bpe", train_texts=SMALL_TEXTS[:-1], vocab_size=300)
    assert changed.name != by_content.name


_CONCURRENT = """
import sys
from locojax.tokenizers import load_tokenizer
texts = [f"{a} times {b} is {a * b}" for a in range(40) for b in range(40)]
tok = load_tokenizer("bpe", train_texts=texts, vocab_size=400, source_id="race")
print(tok.backend.to_str())
"""


def test_bpe_cache_under_concurrent_processes(tmp_path):
    env = {**os.environ, "LOCOJAX_CACHE_DIR": str(tmp_path / "race")}
    procs = [
        subprocess.Popen([sys.executable, "-c", _CONCURRENT], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE)
        for _ in range(3)
    ]  # fmt: skip
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    files = list((tmp_path / "race" / "tokenizers").iterdir())
    assert len(files) == 1, files  # one published file, no temporary leftovers
    assert outs[0] == outs[1] == outs[2] != ""


def test_cache_first_writer_wins():
    a, b = train_bpe(SMALL_TEXTS, 300), train_bpe(SMALL_TEXTS[:50], 270)
    assert a.get_vocab() != b.get_vocab()

    def build_b_after_a_is_published():
        cached_tokenizer("race.json", lambda: a)  # another process publishes first
        return b

    got = cached_tokenizer("race.json", build_b_after_a_is_published)
    assert got.get_vocab() == a.get_vocab()
    assert [p.name for p in cache_dir().iterdir()] == ["race.json"]


def test_tokenizer_pickles_for_ray():
    tok = load_tokenizer("bpe", train_texts=SMALL_TEXTS, vocab_size=300, source_id="p")
    back = pickle.loads(pickle.dumps(tok))
    assert isinstance(back, Tokenizer) and back.stop_ids == tok.stop_ids
    assert back.encode("17+4=21") == tok.encode("17+4=21")


# --- checkpoint and load_tokenizer -----------------------------------------------------------


def test_checkpoint_config_fallbacks(tmp_path):
    train_bpe(SMALL_TEXTS, 300).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": {"content": "<|im_end|>"}}')
    tok = load_tokenizer("checkpoint", checkpoint_dir=tmp_path)
    assert (tok.eos_id, tok.pad_id, tok.stop_ids, tok.bos_id) == (2, 2, (2,), None)

    (tmp_path / "tokenizer_config.json").write_text('{"pad_token": "<|endoftext|>"}')
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [2, 0]}')
    tok = load_tokenizer("checkpoint", checkpoint_dir=str(tmp_path))
    assert (tok.eos_id, tok.pad_id, tok.stop_ids) == (2, 0, (2, 0))

    (tmp_path / "generation_config.json").unlink()
    with pytest.raises(ValueError, match="no eos token"):
        load_tokenizer("checkpoint", checkpoint_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer("checkpoint", checkpoint_dir=tmp_path / "missing")


def test_load_tokenizer_rejects_bad_requests():
    assert KINDS == tuple(TokenizerKind)  # the config's kinds, in its order
    with pytest.raises(ValueError, match="unknown tokenizer kind 'gpt2'"):
        load_tokenizer("gpt2")
    with pytest.raises(ValueError, match="needs train_texts"):
        load_tokenizer("bpe")
    with pytest.raises(ValueError, match="needs checkpoint_dir"):
        load_tokenizer("checkpoint")
    with pytest.raises(ValueError, match="below the 261 fixed ids"):
        load_tokenizer("bpe", train_texts=SMALL_TEXTS, vocab_size=100)


# --- chat template ---------------------------------------------------------------------------

USER = {"role": "user", "content": "What is 2+2?"}


def test_chat_generation_prompt():
    assert apply_chat_template([USER]) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    system = {"role": "system", "content": "Reason step by step."}
    assert apply_chat_template([system, USER], enable_thinking=False) == (
        "<|im_start|>system\nReason step by step.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert apply_chat_template([USER], add_generation_prompt=False) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    )


def test_chat_assistant_reasoning_kept_only_after_last_query():
    answer = {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"}
    follow_up = {"role": "user", "content": "And 3+3?"}
    assert apply_chat_template([USER, answer, follow_up]) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert apply_chat_template([USER, answer], add_generation_prompt=False) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nadd them\n</think>\n\n4<|im_end|>\n"
    )
    plain = {"role": "assistant", "content": "4"}
    assert apply_chat_template([USER, plain], add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n"
    )
    given = {"role": "assistant", "content": "4", "reasoning_content": "\nsum\n"}
    assert apply_chat_template([USER, given, plain], add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\nsum\n</think>\n\n4<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n"
    )
    with pytest.raises(ValueError, match="role 'robot'"):  # tool messages are rendered now
        apply_chat_template([USER, {"role": "robot", "content": "x"}])


@pytest.mark.parametrize("kind", ["char", "qwen"])
def test_saved_tokenizer_reads_back_with_the_same_ids(tmp_path, kind):
    """The HF files the GRPO benchmark gives tunix and TRL encode, decode and stop like ours."""
    from locojax.data import ArithSettings, arith_problems
    from locojax.tokenizers import save_checkpoint_tokenizer

    char = load_tokenizer(kind)
    save_checkpoint_tokenizer(char, tmp_path)
    back = load_tokenizer("checkpoint", checkpoint_dir=tmp_path)
    assert (back.eos_id, back.pad_id, back.stop_ids) == (char.eos_id, char.pad_id, char.stop_ids)
    assert back.bos_id is None and back.vocab_size == char.vocab_size
    train, _ = arith_problems(ArithSettings(max_operand=99, terms=3, ops="+-*"), seed=0)
    specials = "".join(char.backend.id_to_token(i) for i in (char.eos_id, char.pad_id))
    texts = [CHAR_ALPHABET, f"{specials}Q: 1+2=?\nA: #### 3{specials}"]
    texts += [p.question for p in train[:200]] + [p.solution for p in train[:200]]
    ids = char.batch_encode(texts)
    assert back.batch_encode(texts) == ids
    assert back.batch_decode(ids) == char.batch_decode(ids)
    assert back.decode(char.encode("12+7=#### 19")) == "12+7=#### 19"
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["bos_token"] is None and config["clean_up_tokenization_spaces"] is False


def _with_start_token(tmp_path):
    """A checkpoint tokenizer whose post-processor puts `<s>` before every text, as Llama 3's
    puts <|begin_of_text|> and Gemma's <bos> (a BPE on SMALL_TEXTS plus that token)."""
    backend = train_bpe(SMALL_TEXTS, 300)
    backend.add_special_tokens(["<s>"])
    start = backend.token_to_id("<s>")
    backend.post_processor = tk.processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", start)])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 2}')
    return load_tokenizer("checkpoint", checkpoint_dir=tmp_path), backend, start


def test_prompts_start_with_the_token_the_checkpoints_tokenizer_adds(tmp_path):
    tok, backend, start = _with_start_token(tmp_path)
    assert tok.prompt_bos == start
    texts = ["3+4=7", "<s>1+1=2"]  # the second as a chat template writes it: not doubled
    got = tok.encode_prompts(texts)
    # what `transformers`' fast tokenizer gives for `tokenizer(text)`: the Rust encode with
    # the special tokens added
    assert got[0] == backend.encode(texts[0], add_special_tokens=True).ids
    assert got[1] == tok.encode(texts[1]) and got[1].count(start) == 1
    # a prompt cut on the left keeps its start token
    assert tok.keep_end(got[0], 3) == [start, *got[0][-2:]]
    assert tok.keep_end(got[0], 99) == got[0]
    # without one (Qwen's tokenizer, ours), prompts are the text's ids
    train_bpe(SMALL_TEXTS, 300).save(str(tmp_path / "tokenizer.json"))
    plain = load_tokenizer("checkpoint", checkpoint_dir=tmp_path)
    assert plain.prompt_bos is None and plain.encode_prompts(texts) == plain.batch_encode(texts)
    assert load_tokenizer("qwen").prompt_bos is None
    assert plain.keep_end([5, 6, 7], 2) == [6, 7]


def test_host_work_puts_the_start_token_before_plain_prompts(tmp_path):
    from types import SimpleNamespace

    from locojax.data import Problem
    from locojax.runtime.hostwork import HostWork

    tok, backend, start = _with_start_token(tmp_path)
    plan = SimpleNamespace(batch=SimpleNamespace(group_size=1, max_prompt_len=6),
                           workload=SimpleNamespace(enable_thinking=False, chat_template=False,
                                                    prompt_template="{question}"))
    prompts = HostWork(plan, tok, scorer=None).encode([Problem("a/0", "3+4=", "7"),
                                                       Problem("a/1", "12+30+5=", "47")])
    for ids, n in zip(prompts.ids_BxP, prompts.len_B, strict=True):
        assert ids[-n] == start  # the first id of every prompt, the cut one's too
    assert prompts.truncated == 1 and prompts.len_B.tolist() == [5, 6]
    assert prompts.ids_BxP[0, 1:].tolist() == tok.encode_prompts(["3+4="])[0]

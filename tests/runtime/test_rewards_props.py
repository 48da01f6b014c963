"""Any text scores a finite reward without raising: random, adversarial and huge completions."""

import math
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.vocab import RewardKind
from locojax.rewards import RewardSettings, Scorer, last_boxed, normalize_number

FORMAT = 0.1
ALLOWED = {0.0, FORMAT, 1.0}

PIECES = [
    "\\boxed{",
    "\\boxed {",
    "\\fbox{",
    "{",
    "}",
    "\\{",
    "\\}",
    "####",
    "#### ",
    "$",
    ",",
    ".",
    "-",
    "+",
    "1e999999",
    "9" * 5000,
    "10^{10^{10}}",
    "\\frac{",
    "\\sqrt",
    "^{",
    "\ufffd",
    "\udcff",
    "\x00",
    "\\",
    "\n",
    " ",
    "0",
    "7",
    "=",
    "x",
    "\\left(",
    "\\right)",
    "\\infty",
]
adversarial = st.lists(st.sampled_from(PIECES) | st.text(max_size=5), max_size=40).map("".join)
invalid_utf8 = st.binary(max_size=200).map(lambda b: b.decode("utf-8", errors="replace"))
escaped_utf8 = st.binary(max_size=200).map(lambda b: b.decode("utf-8", errors="surrogateescape"))
any_text = st.text() | adversarial | invalid_utf8 | escaped_utf8


@pytest.fixture(scope="module")
def scorers():
    gsm8k = Scorer(RewardSettings(RewardKind.gsm8k, format_reward=FORMAT))
    boxed = Scorer(RewardSettings(RewardKind.boxed, format_reward=FORMAT, timeout_s=1.0))
    yield {"gsm8k": gsm8k, "boxed": boxed}
    boxed.close()


def _check(batch, n):
    assert batch.rewards_B.shape == (n,) and batch.rewards_B.dtype == np.float32
    assert all(math.isfinite(r) for r in batch.rewards_B)
    assert {float(np.float32(r)) for r in batch.rewards_B} <= {
        float(np.float32(a)) for a in ALLOWED
    }


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(any_text, min_size=1, max_size=4), reference=any_text)
def test_gsm8k_scores_any_text(scorers, texts, reference):
    _check(scorers["gsm8k"].score_batch(texts, [reference] * len(texts)), len(texts))


boxed_text = any_text | st.tuples(any_text, any_text).map(lambda t: f"{t[0]}\\boxed{{{t[1]}}}")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(boxed_text, min_size=1, max_size=4), reference=any_text)
def test_boxed_scores_any_text(scorers, texts, reference):
    batch = scorers["boxed"].score_batch(texts, [reference] * len(texts))
    _check(batch, len(texts))
    assert batch.timeouts + batch.errors <= len(texts)


@pytest.mark.parametrize("kind", ["gsm8k", "boxed"])
def test_huge_and_pathological_completions(scorers, kind):
    texts = [
        "",
        "x" * 100_000,
        "\\boxed{" * 20_000 + "}" * 7,
        "{" * 50_000 + "#### 1e999999",
        "#### " + "9" * 100_000,
        "\\boxed{" + "(" * 900 + "}",
        "\\boxed{1e999999}",
        "\ufffd\udcff" * 1000 + "\\boxed{\ufffd}",
    ]
    batch = scorers[kind].score_batch(texts, ["1"] * len(texts))
    _check(batch, len(texts))
    assert not batch.correct_B.any()


decimals = st.one_of(
    [st.decimals(min_value=-(10**30), max_value=10**30, places=p) for p in range(7)]
)


@given(decimals)
def test_normalised_numbers_compare_by_value(value):
    plain = format(value, "f")
    padded = plain + ("0" if "." in plain else ".00")
    with_commas = f"{value:,f}"
    canonical = normalize_number(plain)
    assert canonical is not None and Decimal(canonical) == value
    assert normalize_number(padded) == normalize_number(with_commas) == canonical
    assert normalize_number(canonical) == canonical


@given(st.text(alphabet="{}ab\\", max_size=60))
def test_last_boxed_content_is_balanced(text):
    content = last_boxed("\\boxed{" + text + "}")
    if content is not None:
        unescaped = content.replace("\\{", "").replace("\\}", "")
        depth = 0
        for ch in unescaped:
            depth += {"{": 1, "}": -1}.get(ch, 0)
            assert depth >= 0

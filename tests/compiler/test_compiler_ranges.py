"""Every config field's stated range: the docstring states it, the compiler's first pass checks
it, values drawn outside it are rejected for that rule, values inside pass, and the runtime's
own checks agree with the compiler's."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import hypothesis_profiles  # noqa: F401  (loads the profile named by HYPOTHESIS_PROFILE)
import pytest
from compiler_cases import entry, make_config
from hypothesis import given, settings
from hypothesis import strategies as st
from paths import FIXTURES

from compiler import PlanError, compile_plan, sections
from compiler import config as schema
from compiler.errors import KEYS, RULES, config_fields, value_at
from compiler.model_entry import TOKENIZER_IDS, checkpoint_model
from compiler.passes.ranges import FIELD_RULES, range_errors
from compiler.rules import (
    RELATIONS,
    AtLeast,
    Bound,
    Chars,
    Check,
    Even,
    Finite,
    FormatFields,
    OneOf,
    Subset,
)
from compiler.vocab import Overlong

BASE = make_config(model="tiny", workload="arith", hardware="cpu",
                   mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 1})
"""A config that compiles; each test changes one or more fields of it."""
TYPES = dict(config_fields())
NUMBER_FIELDS = [k for k, tp in TYPES.items() if tp in (int, float)]
FLOAT_FIELDS = [k for k, tp in TYPES.items() if tp is float]
CHECK_EXAMPLES = {
    "model.vocab": ({}, st.integers(1, TOKENIZER_IDS["qwen"] - 1)),  # BASE: qwen tokenizer
    "workload.arith.max_operand": ({}, st.sampled_from([0, 1])),  # 0..1, 2 terms: 1, 4 problems
    "hardware.peak_flops_bf16": ({"model.dtype": schema.DType.bfloat16}, st.just(0.0)),
    "hardware.peak_flops_fp32": ({}, st.just(0.0)),  # BASE: a float32 model
    "run.steps": ({"algorithm.sft_warmup_steps": 0}, st.just(0)),  # no warm-up to run alone
    "controller.coordinator": ({}, st.sampled_from(["h0", "h0:", ":5000", "h0:0", "h0:65536",
                                                    "h0:x", "h0:-1"])),
    "controller.host_index": ({"controller.num_hosts": 2}, st.integers(2, 10**6)),
    "model.rope_scaling.original_max_position": ({"model.rope_scaling.kind": schema.RopeKind.yarn},
                                                 st.just(0)),
    "model.sliding_window": ({"model.sliding_pattern": 6, "model.rope_local_theta": 1e4},
                             st.just(0)),
    "model.rope_local_theta": ({"model.sliding_pattern": 6, "model.sliding_window": 512},
                               st.just(0.0)),
    "model.nope_interval": ({}, st.integers(1, 100)),  # BASE: tiny, a Qwen3
    "model.rope_scaling.high_freq_factor": ({}, st.floats(0.01, 1.0)),  # low_freq_factor 1
    "model.rope_scaling.beta_fast": ({}, st.floats(0.01, 1.0)),  # beta_slow 1
    "model.rope_scaling.attention_factor": ({}, st.floats(-1e6, 0.0)),
    "workload.correct": ({}, st.text(max_size=8)),  # BASE: reward=gsm8k, no reward_fns
    "workload.correct_threshold": ({}, st.floats(-10.0, 10.0)),
    "algorithm.dual_clip": ({"algorithm.loss": schema.PolicyLoss.cispo}, st.floats(1.01, 100.0)),
    "workload.reward_memory_mb": ({}, st.integers(1, 255)),
    "workload.reward_fns": ({}, st.just({"a": "f.py:g"})),  # BASE: gsm8k
    "workload.chat_template": ({"model.tokenizer": schema.TokenizerKind.char}, st.just(True)),
    "workload.reasoning_gym.task": ({}, st.text(min_size=1, max_size=8)),  # BASE: gsm8k
    "workload.max_turns": ({"workload.tools": {"add": "locojax.envs.calculator:add"}},
                           st.just(1)),
    "workload.env_args": ({}, st.just({"game": "Wordle-v0"})),  # BASE: no workload.env
    "algorithm.overlong": ({}, st.sampled_from([Overlong.mask,
                                                Overlong.penalty])),  # BASE: one reply
    "algorithm.overlong_buffer": ({"workload.max_episode_len": 64}, st.integers(64, 1000)),
}
"""Per `Check` relation: changes to BASE, and values that then break it while meeting the
field's own rules."""
INSIDE_EXAMPLES = {"workload.correct": st.none(), "workload.correct_threshold": st.none(),
                   "model.nope_interval": st.just(0), "workload.reasoning_gym.task": st.just(""),
                   "workload.reward_fns": st.just({}), "workload.env_args": st.just({}),
                   "algorithm.overlong": st.just(Overlong.keep)}
"""Values inside the rules of fields whose relations BASE meets only at their default
(BASE scores with gsm8k; test_correctness covers reward=python; BASE is a Qwen3, which has
no NoPE layers)."""
PER_FIELD = settings(max_examples=min(settings.default.max_examples, 40))
"""Tests run once per field: a few dozen draws each keep the whole file near a minute."""


def with_value(cfg, key: str, value):
    """`cfg` with the dotted field `key` set to `value`."""
    head, _, rest = key.partition(".")
    if not rest:
        return dataclasses.replace(cfg, **{head: value})
    return dataclasses.replace(cfg, **{head: with_value(getattr(cfg, head), rest, value)})


def _docstrings() -> dict[str, str]:
    """`{class name: {field: docstring}}` of the schema (compiler/config.py and the sections in
    compiler/sections.py), read from its source."""
    trees = [ast.parse(Path(m.__file__).read_text()) for m in (schema, sections)]
    out = {}
    for cls in (n for tree in trees for n in tree.body if isinstance(n, ast.ClassDef)):
        body = cls.body
        for a, b in zip(body, body[1:], strict=False):
            if (isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr)
                    and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)):
                out[(cls.name, a.target.id)] = " ".join(b.value.value.split())
    return out


def _owner(key: str) -> tuple[str, str]:
    """(class name, field) of a dotted key."""
    *path, name = key.split(".")
    cls = schema.Config
    for part in path:
        cls = {f.name: f for f in dataclasses.fields(cls)}[part].default_factory
    return cls.__name__, name


def test_every_number_field_has_a_rule():
    missing = [k for k in NUMBER_FIELDS if k not in FIELD_RULES]
    assert not missing, (f"{missing}: give each a rule in compiler.passes.ranges.FIELD_RULES "
                         "(one line) and end its docstring with `Range: <the rule's text>`")
    assert set(FIELD_RULES) <= set(TYPES), "rules for keys the schema does not have"
    assert set(FIELD_RULES) <= KEYS


def test_docstrings_state_the_rules():
    docs = _docstrings()
    for key, rules in FIELD_RULES.items():
        want = "Range: " + "; ".join(r.text for r in rules)
        assert want in docs[_owner(key)], f"{key}: its docstring must state {want!r}"


def test_shipped_entries_and_experiments_are_in_range():
    from locojax.config.compose import CONF_DIR, compose_config

    for name in sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")):
        errors = range_errors(compose_config([f"+experiment={name}"]))
        assert errors == [], (name, [str(e) for e in errors])
    for group in ("model", "hardware", "workload", "algorithm", "controller"):
        for path in sorted((CONF_DIR / group).glob("*.yaml")):
            if path.stem != "auto":
                chosen = entry(group, path.stem)
                if group == "model" and chosen.from_checkpoint:  # model=hf: numbers filled
                    chosen = checkpoint_model(dataclasses.replace(
                        chosen, checkpoint=str(FIXTURES / "tiny_qwen3"), tokenizer="char"))
                cfg = dataclasses.replace(BASE, **{group: chosen})
                errors = [str(e) for e in range_errors(cfg) if e.key.startswith(group)]
                assert errors == [], (path, errors)
    assert range_errors(BASE) == []


def _outside_bound(rule: Bound, tp: type) -> st.SearchStrategy:
    parts = []
    if tp is int:
        if rule.lo is not None:
            parts.append(st.integers(max_value=int(rule.lo) - (0 if rule.lo_open else 1)))
        if rule.hi is not None:
            parts.append(st.integers(min_value=int(rule.hi) + (0 if rule.hi_open else 1)))
    else:
        finite = dict(allow_nan=False, allow_infinity=False)
        if rule.lo is not None:
            parts.append(st.floats(max_value=rule.lo, exclude_max=not rule.lo_open, **finite))
        if rule.hi is not None:
            parts.append(st.floats(min_value=rule.hi, exclude_min=not rule.hi_open, **finite))
    return st.one_of(parts).filter(lambda v: v not in rule.also)


def _outside(key: str, rule) -> st.SearchStrategy:
    """Values of `key` that break `rule` (and meet the rules listed before it)."""
    tp = TYPES[key]
    if isinstance(rule, Bound):
        return _outside_bound(rule, tp)
    if isinstance(rule, Even):
        return st.integers(1, 10**6).map(lambda k: 2 * k + 1)
    if isinstance(rule, Finite):
        return st.sampled_from([math.nan, math.inf, -math.inf])
    if isinstance(rule, FormatFields):
        return st.text(alphabet="{}question0x.!:", max_size=14).filter(
            lambda v: not rule.holds(v, BASE))
    if isinstance(rule, (OneOf, Chars)):
        return st.text(max_size=12).filter(lambda v: not rule.holds(v, BASE))
    if isinstance(rule, Subset):
        return st.lists(st.sampled_from([*rule.values, "qkv", ""]), max_size=4).filter(
            lambda v: not rule.holds(v, BASE))
    if isinstance(rule, AtLeast):
        return st.integers(max_value=value_at(BASE, rule.other) - 1)
    if isinstance(rule, Check):
        return CHECK_EXAMPLES[key][1]
    raise AssertionError(f"{key}: no generator for rule kind {type(rule).__name__}")


def test_every_check_has_examples():
    checks = {k for k, rules in FIELD_RULES.items() for r in rules if isinstance(r, Check)}
    assert checks == set(CHECK_EXAMPLES)


def _rejected(cfg, key: str, value, rule_text: str, rule_id: str) -> None:
    errors = range_errors(cfg)
    assert [e.key for e in errors] == [key], [str(e) for e in errors]
    err = errors[0]
    assert err.rule_id == rule_id and err.rule_id in RULES
    assert rule_text in err.rule
    same = err.value == value or (isinstance(value, float) and math.isnan(value)
                                  and math.isnan(err.value))
    assert same and "\n" not in str(err) and str(err).startswith(f"{key}=")
    with pytest.raises(PlanError) as raised:  # the compiler's first pass: nothing else runs
        compile_plan(cfg)
    assert (raised.value.key, raised.value.rule_id) == (key, rule_id)


CASES = [(key, i) for key, rules in FIELD_RULES.items() for i in range(len(rules))]


@pytest.mark.parametrize("key,index", CASES, ids=[f"{k}[{i}]" for k, i in CASES])
@PER_FIELD
@given(data=st.data())
def test_values_outside_each_rule_are_rejected_for_it(key, index, data):
    rule = FIELD_RULES[key][index]
    value = data.draw(_outside(key, rule))
    earlier = FIELD_RULES[key][:index]
    if not all(r.holds(value, BASE) for r in earlier):  # e.g. even but below the bound
        return
    if isinstance(rule, Finite):  # the finite pass every float field gets rejects it first
        _rejected(with_value(BASE, key, value), key, value, "finite", "finite")
        return
    kind = ("relation" if isinstance(rule, RELATIONS)
            else "choice" if isinstance(rule, (OneOf, Chars, Subset, FormatFields)) else "bound")
    base = BASE
    for other, setting in (CHECK_EXAMPLES[key][0] if isinstance(rule, Check) else {}).items():
        base = with_value(base, other, setting)
    _rejected(with_value(base, key, value), key, value, rule.text, kind)


@pytest.mark.parametrize("key", FLOAT_FIELDS)
@PER_FIELD
@given(value=st.sampled_from([math.nan, math.inf, -math.inf]))
def test_non_finite_floats_are_rejected(key, value):
    _rejected(with_value(BASE, key, value), key, value, "finite", "finite")


def _inside(key: str) -> st.SearchStrategy:
    """Values of `key` that meet its own rules (relations are drawn against BASE)."""
    rules = FIELD_RULES[key]
    tp = TYPES[key]
    if key in INSIDE_EXAMPLES:
        return INSIDE_EXAMPLES[key]
    if tp in (int, float):
        lo = max((r.lo for r in rules if isinstance(r, Bound) and r.lo is not None),
                 default=-10**9)
        hi = min((r.hi for r in rules if isinstance(r, Bound) and r.hi is not None),
                 default=10**9)
        base = (st.integers(int(lo), int(hi)) if tp is int
                else st.floats(lo, hi, allow_nan=False, allow_infinity=False))
        for r in rules:
            if isinstance(r, AtLeast):
                base = st.integers(value_at(BASE, r.other) + 4, int(hi))
        return st.one_of(base, *(st.just(a) for r in rules if isinstance(r, Bound)
                                 for a in r.also)).filter(
            lambda v: all(r.holds(v, BASE) for r in rules))
    if isinstance(rules[0], OneOf):
        return st.sampled_from(rules[0].values)
    if isinstance(rules[0], Chars):
        return st.text(alphabet=rules[0].alphabet, min_size=1, max_size=8)
    if isinstance(rules[0], Subset):
        return st.lists(st.sampled_from(rules[0].values), min_size=1, unique=True)
    # Free text, and host:port addresses (controller.coordinator accepts only those or "").
    return st.one_of(st.text(alphabet="abc {}", max_size=12),
                     st.builds("{}:{}".format, st.sampled_from(["localhost", "10.0.0.1", "n-3"]),
                               st.integers(1, 65535))).filter(lambda v: rules[0].holds(v, BASE))


@pytest.mark.parametrize("key", list(FIELD_RULES))
@PER_FIELD
@given(data=st.data())
def test_values_inside_the_rules_pass_the_range_check(key, data):
    value = data.draw(_inside(key))
    errors = range_errors(with_value(BASE, key, value))
    assert [str(e) for e in errors if e.key == key] == []


@given(st.data())
def test_every_violation_is_one_error(data):
    own = [k for k, rules in FIELD_RULES.items() if not isinstance(rules[0], RELATIONS)]
    keys = data.draw(st.lists(st.sampled_from(own), min_size=1, max_size=6, unique=True))
    cfg = BASE
    for key in keys:
        cfg = with_value(cfg, key, data.draw(_outside(key, FIELD_RULES[key][0])))
    got = [e.key for e in range_errors(cfg)]
    assert set(keys) <= set(got) and len(got) == len(set(got)), (keys, got)


# The runtime's own checks reject exactly what the compiler's ranges reject.

@given(temperature=st.floats(-2, 3), top_p=st.floats(-1, 2), top_k=st.integers(-3, 5))
def test_sampling_settings_agree_with_the_ranges(temperature, top_p, top_k):
    from locojax.rollout.sampler import SamplingSettings

    cfg = dataclasses.replace(BASE, sampling=schema.SamplingConfig(temperature, top_p, top_k))
    try:
        SamplingSettings(temperature=temperature, top_p=top_p, top_k=top_k)
        runtime_ok = True
    except ValueError:
        runtime_ok = False
    assert runtime_ok == (range_errors(cfg) == [])


@given(lo=st.integers(-2, 4), hi=st.integers(-2, 6), terms=st.integers(0, 3),
       ops=st.sampled_from(["+", "+-", "*", "", "%", "+/"]))
def test_arith_settings_agree_with_the_ranges(lo, hi, terms, ops):
    from locojax.data import DataError
    from locojax.data.arith import validate
    from locojax.data.problem import ArithSettings

    arith = schema.ArithConfig(min_operand=lo, max_operand=hi, terms=terms, ops=ops)
    cfg = with_value(BASE, "workload.arith", arith)
    try:
        validate(ArithSettings(min_operand=lo, max_operand=hi, terms=terms, ops=ops))
        runtime_ok = True
    except DataError:
        runtime_ok = False
    assert runtime_ok == (range_errors(cfg) == [])


def test_tokenizer_ids_match_the_runtime_tokenizers():
    from locojax.tokenizers import load_tokenizer
    from locojax.tokenizers.bpe import BPE_ADDED, BPE_SPECIALS

    for kind in ("qwen", "char", "ascii"):
        assert TOKENIZER_IDS[kind] == load_tokenizer(kind).vocab_size
    assert TOKENIZER_IDS["bpe"] == len(BPE_SPECIALS) + len(BPE_ADDED) + 256


@given(template=st.text(alphabet="{}q0x.!: ", max_size=10).map(lambda t: "{question}" + t))
def test_prompt_template_rule_agrees_with_the_runtime(template):
    from locojax.data import DataError
    from locojax.data.problem import Problem, render_prompt

    try:
        render_prompt(Problem("u", "2+2=", "4"), template)
        runtime_ok = True
    except DataError:
        runtime_ok = False
    cfg = with_value(BASE, "workload.prompt_template", template)
    assert runtime_ok == (range_errors(cfg) == [])


@pytest.mark.parametrize("tokenizer", [schema.TokenizerKind.char, schema.TokenizerKind.ascii])
def test_the_chat_template_is_refused_for_a_vocabulary_without_chat_tokens(tokenizer):
    # An ascii run with the template reached its first reply cut at its length and stopped
    # with a KeyError for <|im_end|> (examples/guess with model.tokenizer=ascii).
    with pytest.raises(PlanError) as err:
        compile_plan(make_config(overrides={"model": {"tokenizer": tokenizer},
                                            "workload": {"chat_template": True}}))
    assert err.value.key == "workload.chat_template"

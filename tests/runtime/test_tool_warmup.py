"""The tool recipes' warm-up: a reference episode written for the supervised warm-up
(`turns.reference_ids`) token for token as `run_episodes` writes the same episode when the
model gives the reference's replies (the real tool in a worker process): a generated sum's
with the built-in `add` tool (`+experiment=arith_tools_co`, the ascii tokenizer's plain turn
format), and a GSM8K solution's calculator annotations with `calculate` (`gsm8k_tools_co`,
Qwen3's chat template)."""

import json

import numpy as np
import pytest
from paths import DATA, needs_data

from locojax.data import Problem
from locojax.data.arith import _problem, add_tool_episode
from locojax.envs.calculations import calculator_episode
from locojax.envs.calculator import add
from locojax.envs.runner import EnvRunner, EnvSpec
from locojax.envs.tools import parse_tool_calls
from locojax.runtime.episode import _reference
from locojax.runtime.hostwork import Completions
from locojax.runtime.turns import TurnFormat, TurnLimits, reference_ids, run_episodes
from locojax.tokenizers import load_tokenizer
from locojax.tokenizers.qwen import load_qwen3

TOK = load_tokenizer("ascii", vocab_size=128)
R, P = 80, 64


@pytest.fixture(scope="module")
def runner():
    r = EnvRunner(EnvSpec(env="", tools=(("add", "locojax.envs.calculator:add"),),
                          step_timeout_s=5, tool_timeout_s=5, workers=1))
    schemas = r.check()
    yield r, TurnFormat(TOK, chat=False, thinking=False, tools=tuple(schemas))
    r.close()


def _scripted(replies: list[str], tok=TOK):
    """A generation answering turn t of every episode with replies[t] and the stop token."""
    def generate(prompts, turn: int, wave: int) -> Completions:
        b, w = prompts.ids_BxP.shape
        ids = tok.encode(replies[turn]) + [tok.eos_id]
        tokens = np.zeros((b, w + R), np.int32)
        tokens[:, :w], tokens[:, w:w + len(ids)] = prompts.ids_BxP, ids
        mask = np.zeros((b, R), bool)
        mask[:, :len(ids)] = True
        logp = np.zeros((b, R), np.float32)
        return Completions(tokens, mask, logp, logp, np.full(b, len(ids), np.int32),
                           prompts.len_B)
    return generate


def test_the_reference_episode_is_the_transcript_the_run_writes(runner):
    env, fmt = runner
    reference = add_tool_episode(123, 456)
    assert [role for role, _ in reference] == ["assistant", "tool", "assistant"]
    assert reference[1][1] == "579" and reference[2][1] == "#### 579"
    (call,), malformed = parse_tool_calls(reference[0][1])
    assert malformed == 0 and add(**call.arguments) == 579
    limits = TurnLimits(prompt=P, episode=128, reply=R, turns=2, stop_ids=(TOK.eos_id,),
                        pad_id=TOK.pad_id)
    row = {"prompt": "123+456=", "question": "123+456=", "answer": "579"}
    eps = run_episodes([row], env, fmt, limits,
                       _scripted([c for r, c in reference if r == "assistant"]), group=1)
    assert eps.tool_calls == 1 and eps.tool_errors == 0 and eps.last_texts == ["#### 579"]
    c = eps.completions
    opening, ids, trained = reference_ids(fmt, "123+456=", reference, ["add"])
    n = int(c.lengths_B[0])
    assert c.tokens_BxL[0, P - int(c.prompt_len_B[0]):P].tolist() == opening
    assert c.tokens_BxL[0, P:P + n].tolist() == ids and c.mask_BxT[0, :n].tolist() == trained
    # the replies and their end tokens are trained; the tool's line and the next prompt not
    text = TOK.decode(ids, skip_special=False)
    assert "\nTool: 579\nAssistant: " in text and TOK.decode(opening).startswith(
        "System: Tools: add(a, b)\nUser: 123+456=\nAssistant: ")
    assert sum(trained) == len(TOK.encode(reference[0][1])) + len(TOK.encode("#### 579")) + 2


def test_a_reference_the_run_cannot_replay_is_not_trained(runner):
    _, fmt = runner
    assert reference_ids(fmt, "1+2=", add_tool_episode(1, 2), ["calculate"]) is None
    broken = (("assistant", "<tool_call>\nnot json\n</tool_call>"), ("assistant", "#### 3"))
    assert reference_ids(fmt, "1+2=", broken, ["add"]) is None


def test_only_sums_of_two_operands_carry_the_add_episode():
    assert _problem("a/0", "12+30=", 42).reference == add_tool_episode(12, 30)
    assert _problem("a/1", "1+2+3=", 6).reference is None
    assert _problem("a/2", "7-2=", 5).reference is None
    with pytest.raises(ValueError, match="not an integer"):
        add("1", 2)


FIRST_GSM8K = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = "
               "<<48+24=72>>72 clips altogether in April and May.\n#### 72")
"""The solution of GSM8K's first training row (../shared/data/gsm8k/train.jsonl)."""


@needs_data
def test_a_gsm8k_solution_becomes_calls_results_and_the_plain_solution():
    assert json.loads((DATA / "gsm8k" / "train.jsonl").open().readline())["answer"] \
        == FIRST_GSM8K
    calls, *results, last = calculator_episode(FIRST_GSM8K)
    assert [c.arguments for c in parse_tool_calls(calls[1])[0]] == [
        {"expression": "48/2"}, {"expression": "48+24"}]
    assert results == [("tool", "24"), ("tool", "72")]
    assert last == ("assistant", "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = "
                                 "72 clips altogether in April and May.\n#### 72")
    assert calculator_episode("no calculation\n#### 3") is None
    assert calculator_episode("<<x+1=2>>2 #### 2") is None  # not arithmetic: no episode
    assert calculator_episode("<<1+1=2>>2 " * 9 + "#### 2") is None  # over MAX_CALLS


def test_the_calculator_episode_is_the_transcript_the_run_writes():
    tok = load_qwen3()
    env = EnvRunner(EnvSpec(env="", tools=(("calculate", "locojax.envs.calculator:calculate"),),
                            step_timeout_s=5, tool_timeout_s=5, workers=1))
    try:
        fmt = TurnFormat(tok, chat=True, thinking=False, tools=tuple(env.check()))
        reference = calculator_episode(FIRST_GSM8K)
        limits = TurnLimits(prompt=256, episode=512, reply=R, turns=2,
                            stop_ids=(tok.eos_id,), pad_id=tok.pad_id)
        row = {"prompt": "How many clips?", "question": "How many clips?", "answer": "72"}
        eps = run_episodes([row], env, fmt, limits, _scripted(
            [c for r, c in reference if r == "assistant"], tok), group=1)
    finally:
        env.close()
    assert eps.tool_calls == 2 and eps.tool_errors == 0 and eps.last_texts[0].endswith("#### 72")
    c, n = eps.completions, int(eps.completions.lengths_B[0])
    opening, ids, trained = reference_ids(fmt, "How many clips?", reference, ["calculate"])
    assert c.tokens_BxL[0, 256 - int(c.prompt_len_B[0]):256].tolist() == opening
    assert c.tokens_BxL[0, 256:256 + n].tolist() == ids and c.mask_BxT[0, :n].tolist() == trained
    text = tok.decode([i for i, m in zip(ids, trained, strict=True) if not m],
                      skip_special=False)
    assert "<tool_response>\n24\n</tool_response>" in text and "72" in text
    assert reference_ids(fmt, "How many clips?", reference, ["add"]) is None


def test_the_warm_up_takes_a_solutions_calculator_episode():
    """A problem with no reference of its own trains its solution's calculator episode where
    the run has `calculate` (`runtime.episode._reference`), its solution elsewhere."""
    tok = load_qwen3()
    schema = {"type": "function", "function": {"name": "calculate", "description": "",
                                               "parameters": {"type": "object"}}}
    fmt = TurnFormat(tok, chat=True, thinking=False, tools=(schema,))
    problem = Problem("gsm8k/train/0", "How many clips?", "72", FIRST_GSM8K)
    got = _reference(fmt, ["calculate"], problem, "{question}")
    assert got == reference_ids(fmt, "How many clips?", calculator_episode(FIRST_GSM8K),
                                ["calculate"])
    assert _reference(fmt, ["add"], problem, "{question}") is None
    assert _reference(None, ["calculate"], problem, "{question}") is None

"""The calculator tool of `+experiment=gsm8k_tools_co`: arithmetic parsed (never eval-ed), its
schema in Qwen3's tools block, and a model's call run by the real environment runner."""

import json

import pytest

from compiler import compile_plan
from locojax.config.compose import compose_config
from locojax.envs.calculator import calculate
from locojax.envs.runner import EnvRunner, EnvSpec
from locojax.envs.tools import tool_result_text
from locojax.tokenizers.chat import apply_chat_template


@pytest.mark.parametrize("expression,value", [
    ("(48 / 2) * 3", "72"), ("1/3", "0.3333333333"), ("2**10", "1024"), ("10 // 3", "3"),
    ("-5 + 2", "-3"), ("7 % 4", "3"), (" 0.5 * 4 ", "2")])
def test_arithmetic(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize("expression,why", [
    ("__import__('os').system('true')", "only numbers"), ("x + 1", "only numbers"),
    ("[1, 2]", "only numbers"), ("9 ** 9 ** 9", "exponent"), ("1 / 0", "division by zero"),
    ("1e300 * 1e300", "out of range"), ("2 +", "not an arithmetic expression"),
    ("1" * 201, "longer than 200")])
def test_anything_else_is_refused_with_a_reason(expression, why):
    with pytest.raises(ValueError, match=why):
        calculate(expression)


def _recipe_tools() -> tuple[tuple[str, str], ...]:
    return tuple(compose_config(["+experiment=gsm8k_tools_co"]).workload.tools.items())


def test_the_recipe_plans_whole_episodes_with_the_tool():
    plan = compile_plan(compose_config(["+experiment=gsm8k_tools_co", "mesh=v5e",
                                        "mesh.chips=8"]))
    assert dict(_recipe_tools()) == {"calculate": "locojax.envs.calculator:calculate"}
    assert plan.workload.max_turns == 4
    assert plan.batch.seq_len == 384 + 1024  # the prompt (its tools block), then the episode


def test_a_models_call_is_run_and_its_result_returned():
    runner = EnvRunner(EnvSpec(env="", tools=_recipe_tools(), step_timeout_s=5,
                               tool_timeout_s=5, workers=1))
    try:
        (schema,) = runner.check()
        system = apply_chat_template([{"role": "user", "content": "q"}], tools=[schema])
        assert '"name": "calculate"' in system and "<tools>" in system
        runner.open([{"prompt": "A pen costs 3 dollars. What do 17 pens cost?"}])
        call = {"name": "calculate", "arguments": {"expression": "17 * 3"}}
        turn = runner.step({0: f"<tool_call>\n{json.dumps(call)}\n</tool_call>"})[0]
        assert turn.messages == ({"role": "tool", "content": tool_result_text("51")},)
        assert (turn.tool_calls, turn.tool_errors, turn.done) == (1, 0, False)
        bad = {"name": "calculate", "arguments": {"expression": "open('x')"}}
        turn = runner.step({0: f"<tool_call>\n{json.dumps(bad)}\n</tool_call>"})[0]
        assert turn.tool_errors == 1 and "only numbers" in turn.messages[0]["content"]
        assert runner.step({0: "#### 51"})[0].done
    finally:
        runner.close()

"""Issue 60, item 2: the tools recipe's prompt limit holds its openings whole (Qwen3's tools
block adds ~203 tokens to each GSM8K question), and a run whose first step cuts more than 5%
of its prompts says so in one line naming the key."""

import json

import numpy as np
from paths import DATA, needs_data

from locojax.config.compose import compose_config
from locojax.envs.calculator import calculate
from locojax.envs.tools import tool_schema
from locojax.runtime.steps import cut_prompts_warning
from locojax.runtime.turns import TurnFormat
from locojax.tokenizers.qwen import load_qwen3


@needs_data
def test_the_gsm8k_tools_recipe_holds_99_percent_of_its_openings_whole():
    cfg = compose_config(["+experiment=gsm8k_tools_co"])
    w = cfg.workload
    fmt = TurnFormat(load_qwen3(), chat=True, thinking=w.enable_thinking,
                     tools=(tool_schema(calculate),))
    for split in ("train", "test"):
        rows = [json.loads(line) for line in (DATA / "gsm8k" / f"{split}.jsonl").open()]
        n = np.array([len(fmt.opening([{"role": "user", "content": w.prompt_template.format(
            question=r["question"])}])) for r in rows[::4]])
        assert np.median(n) > 256  # the limit the recipe inherited cut more than half
        assert (n <= w.max_prompt_len).mean() >= 0.99, (split, w.max_prompt_len)


def test_a_first_step_cutting_more_than_5_percent_says_so_naming_the_key():
    assert cut_prompts_warning({"prompts_truncated": 1}, 24) is None
    line = cut_prompts_warning({"prompts_truncated": 13}, 24)
    assert "workload.max_prompt_len" in line and "13 of 24" in line and "\n" not in line

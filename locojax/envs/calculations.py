"""A worked solution's calculator annotations as a reference episode with the `calculate` tool.

    "Natalia sold 48/2 = <<48/2=24>>24 clips in May. ... #### 72"
        --annotations <<expression=value>>, in order-->
    assistant: one <tool_call> per annotation (Qwen3's format, `calculate`, its expression)
    tool:      each call's result, as the run's `calculate` returns it
    assistant: the solution without its annotations ("... 48/2 = 24 clips in May. ... #### 72")

GSM8K's solutions carry such annotations (its calculator's). A multi-turn run with the
`calculate` tool (`gsm8k_tools_co`) trains these episodes in its supervised warm-up
(`algorithm.sft_warmup_steps`, `runtime.episode.sft_rows`, for a problem with no reference of
its own), which teaches a model the call format before RL (as `arith_tools_co`'s sums do
with `add`). A solution with no annotation, more than `MAX_CALLS`, or one `calculate`
refuses (a few of GSM8K's are not arithmetic) has no episode; the warm-up then trains its
plain solution.
"""

from __future__ import annotations

import json
import re

from locojax.envs.calculator import calculate
from locojax.envs.tools import tool_result_text

ANNOTATION = re.compile(r"<<([^<>=]+)=([^<>]*)>>")
"""GSM8K's calculator annotation: <<expression=value>>."""
MAX_CALLS = 8
"""Annotations in one reference reply at most (GSM8K's solutions use 1-8; longer ones would
not fit the recipe's 256-token reply)."""


def calculator_episode(solution: str) -> tuple[tuple[str, str], ...] | None:
    """The reference episode of `solution` with the `calculate` tool (module docstring), or
    None (no annotation, too many, or one that is not arithmetic)."""
    expressions = [m.group(1).strip() for m in ANNOTATION.finditer(solution)]
    if not expressions or len(expressions) > MAX_CALLS:
        return None
    try:
        results = [tool_result_text(calculate(e)) for e in expressions]
    except ValueError:
        return None
    calls = "\n".join(
        "<tool_call>\n" + json.dumps({"name": "calculate", "arguments": {"expression": e}})
        + "\n</tool_call>" for e in expressions)
    return (("assistant", calls), *(("tool", r) for r in results),
            ("assistant", ANNOTATION.sub("", solution)))

"""The reward of `workload=reasoning_gym`: the task's own `score_answer` on the answer a
completion gives between `<answer>` and `</answer>` (the package's convention, read by its
`reasoning_gym.utils.extract_answer`). Run in the reward workers like any function of the
user's (`workload.reward_fns.score=locojax.rewards.reasoning_gym:score`).

    completion ──extract_answer──> the answer text (none: 0.0)
               ──get_score_answer_fn(metadata["source_dataset"])(text, {answer, metadata})──>
               a score in [0, 1] (1.0: correct; some tasks give partial credit)
"""

from __future__ import annotations

from collections.abc import Sequence


def _text(completion: object) -> str:
    """The reply's text: the string, or the last message's content (conversational rows)."""
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def score(prompts: Sequence[object], completions: Sequence[object], answer: Sequence[str],
          metadata: Sequence[dict], **columns: object) -> list[float]:
    """Each completion's score by its task's `score_answer` (rows from
    `locojax.data.gym.gym_rows`: `answer` and `metadata` columns)."""
    from reasoning_gym import get_score_answer_fn
    from reasoning_gym.utils import extract_answer

    out = []
    for completion, reference, meta in zip(completions, answer, metadata, strict=True):
        given = extract_answer(_text(completion), tag_name="answer")
        if given is None:
            out.append(0.0)
            continue
        judge = get_score_answer_fn(meta["source_dataset"])
        out.append(float(judge(given, {"answer": reference, "metadata": meta})))
    return out

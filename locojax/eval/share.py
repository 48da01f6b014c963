"""Which prompts each host of a cluster evaluates, and the rows every host gathers on host 0.

    P prompts ──blocks(P)──> EVAL_BLOCKS blocks of equal size (the last padded)
        block b ──host b % H──> k samples each, key fold_in(key, b)
        every host's rows ──all_gather_text──> host 0: in prompt order

A block is sampled with the same shapes and the same key whatever the number of hosts, so one
host and a cluster draw the same completions for the same checkpoint and seed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np

from locojax.runtime.evaluation import EvalSamples

EVAL_BLOCKS = 16
"""Blocks the prompts are split into (fewer when there are fewer prompts): clusters of up to
this many hosts all get work, and one compiled program serves every block."""


def block_size(prompts: int) -> int:
    """Prompts per block for `prompts` prompts."""
    return max(math.ceil(prompts / EVAL_BLOCKS), 1)


def host_blocks(prompts: int, host: int, hosts: int) -> list[tuple[int, int, int]]:
    """(block index, first prompt, end) of each block host `host` of `hosts` evaluates."""
    size = block_size(prompts)
    count = math.ceil(prompts / size) if prompts else 0
    return [(b, b * size, min((b + 1) * size, prompts)) for b in range(count) if b % hosts == host]


def take(result: EvalSamples, n: int) -> EvalSamples:
    """The first n prompts of `result` (a block's padding left out)."""
    correct = None if result.correct_PxK is None else result.correct_PxK[:n]
    return EvalSamples(correct, result.texts[:n], result.lengths_PxK[:n],
                       result.truncated_PxK[:n])


def rows_of(result: EvalSamples, first: int, host: int) -> list[dict]:
    """One row per prompt of a block starting at prompt `first`, evaluated by `host`; its
    `correct` flags only when correctness is known."""
    flags = ([None] * len(result.texts) if result.correct_PxK is None
             else result.correct_PxK)
    return [{"index": first + i, "host": host, "completions": texts,
             **({} if ok is None else {"correct": [bool(x) for x in ok]}),
             "lengths": [int(x) for x in n], "truncated": [bool(x) for x in cut]}
            for i, (texts, ok, n, cut) in enumerate(zip(
                result.texts, flags, result.lengths_PxK, result.truncated_PxK, strict=True))]


def merged(texts: Sequence[str], prompts: int) -> list[dict]:
    """Every host's rows (JSON lists, host order) in prompt order; each prompt exactly once."""
    rows = sorted((r for t in texts for r in json.loads(t)), key=lambda r: r["index"])
    if [r["index"] for r in rows] != list(range(prompts)):
        raise RuntimeError(f"evaluation: the hosts' rows cover {len(rows)} prompts, not "
                           f"0..{prompts - 1} once each")
    return rows


def samples_of(rows: Sequence[dict], k: int) -> EvalSamples:
    """The EvalSamples of gathered rows (for the summary); correctness unknown when the rows
    carry no `correct` flags."""
    p = len(rows)
    known = all("correct" in r for r in rows)
    return EvalSamples(np.array([r["correct"] for r in rows], bool).reshape(p, k) if known
                       else None,
                       [r["completions"] for r in rows],
                       np.array([r["lengths"] for r in rows], int).reshape(p, k),
                       np.array([r["truncated"] for r in rows], bool).reshape(p, k))

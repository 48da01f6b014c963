"""Prompt sources: generated arithmetic, GSM8K and NuminaMath-style data, sharded per host."""

from locojax.data.arith import ArithTrain, arith_problems, eval_problems, problem_space
from locojax.data.problem import (
    ArithSettings,
    DataError,
    GymSettings,
    Problem,
    WorkloadSettings,
    render_prompt,
)
from locojax.data.stream import DataPosition, PromptStream, indices_at, shard, shard_bounds
from locojax.data.workload import Workload, load_workload, problems_from_rows, reference_answer

__all__ = [
    "ArithSettings",
    "ArithTrain",
    "DataError",
    "DataPosition",
    "GymSettings",
    "Problem",
    "PromptStream",
    "Workload",
    "WorkloadSettings",
    "arith_problems",
    "eval_problems",
    "indices_at",
    "load_workload",
    "problem_space",
    "problems_from_rows",
    "reference_answer",
    "render_prompt",
    "shard",
    "shard_bounds",
]

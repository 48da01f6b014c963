"""A sliding layer's rollout cache in the plan: its window where the slot is wider.

The slot loop keeps a ring of `sliding_window` columns for each sliding layer whose window is
narrower than the slot (`locojax.rollout.layout.ring_columns`); the prompt store and
multi-turn episodes' caches keep every column. The plan's KV bytes count the same.
"""

import pytest

from compiler import compile_plan
from compiler.cost.memory import kv_columns, sliding_layers
from compiler.passes.lengths import cache_len
from locojax.config.compose import compose_config


def _plan(*overrides: str):
    return compile_plan(compose_config(["model=gemma3_1b", "mesh=v5e", "mesh.chips=8",
                                        *overrides]))


def test_gemma3_1b_has_22_sliding_layers_of_26():
    model = _plan("+experiment=gsm8k_co").model.config
    assert (model.num_layers, model.sliding_pattern, model.sliding_window) == (26, 6, 512)
    assert sliding_layers(model) == 22  # layers 5, 11, 17 and 23 are full


def test_a_slot_keeps_the_sliding_layers_window_only():
    plan = _plan("+experiment=gsm8k_co")
    model, b = plan.model.config, plan.batch
    assert b.seq_len > 512
    per_column = 2 * model.num_kv_heads * model.head_dim * 2  # K and V, bf16
    want = per_column * (4 * b.seq_len + 22 * 512)
    assert b.kv_bytes_per_sequence == pytest.approx(want)
    assert kv_columns(model, b.seq_len) == 26 * b.seq_len  # the store's count: every column


def test_a_slot_narrower_than_the_window_keeps_every_column():
    model = _plan("+experiment=gsm8k_co").model.config
    assert kv_columns(model, 300, ring=True) == kv_columns(model, 300) == 26 * 300


def test_multi_turn_episodes_keep_every_column():
    plan = _plan("+experiment=gsm8k_tools_co")
    model = plan.model.config
    columns = cache_len(plan.workload, plan.sampling)
    assert columns > 512
    per_column = 2 * model.num_kv_heads * model.head_dim * 2
    assert plan.batch.kv_bytes_per_sequence == pytest.approx(per_column * 26 * columns)

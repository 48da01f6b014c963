"""One place derives a step's PRNG keys (`locojax.episodes.keys`): the keys are the run's
(seed, step, stream, batch, turn) folded in that order, and no mode or host-step module
derives one of its own."""

import ast

import jax
import numpy as np
from paths import ROOT

from locojax.episodes.keys import EVAL_STREAM, StepKeys, turn_key


def _data(key):
    return np.asarray(jax.random.key_data(key))


def _fold(*values):
    key = jax.random.key(values[0])
    for v in values[1:]:
        key = jax.random.fold_in(key, v)
    return key


def test_the_keys_fold_seed_step_stream_batch_and_turn():
    keys = StepKeys(seed=7, step=3)
    np.testing.assert_array_equal(_data(keys.sampling(2)), _data(_fold(7, 3, 2)))
    np.testing.assert_array_equal(_data(keys.sampling(2, 0)), _data(_fold(7, 3, 2)))
    np.testing.assert_array_equal(_data(keys.sampling(2, 4)), _data(_fold(7, 3, 2, 4)))
    np.testing.assert_array_equal(_data(keys.evaluation()), _data(_fold(7, 3, EVAL_STREAM)))
    np.testing.assert_array_equal(_data(keys.evaluation(0)),
                                  _data(_fold(7, 3, EVAL_STREAM, 0)))
    np.testing.assert_array_equal(_data(turn_key(keys.sampling(1, 2), 5)),
                                  _data(_fold(7, 3, 1, 2, 5)))
    assert not np.array_equal(_data(keys.sampling(0)), _data(StepKeys(7, 4).sampling(0)))


def test_no_mode_or_host_step_module_derives_a_key_of_its_own():
    rooms = ("runtime", "co", "disagg", "single", "eval")
    found = []
    for room in rooms:
        for path in sorted((ROOT / "locojax" / room).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Attribute) and node.attr in ("fold_in", "key", "PRNGKey")
                        and isinstance(node.value, ast.Attribute) and node.value.attr == "random"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found

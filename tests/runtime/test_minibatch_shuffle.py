"""Issue 40, item 5: a batch's rows are shuffled over its mini-batches each step, a pure
function of (run.seed, step, process): the same seed gives the same updates."""

import numpy as np

from locojax.train.batch import shuffled_rows
from locojax.train.step import split_minibatches


def _rows(n: int = 12) -> dict[str, np.ndarray]:
    return {"tokens_BxL": np.arange(n * 3).reshape(n, 3), "advantages_B": np.arange(n) * 0.5}


def test_the_permutation_is_the_seeds_and_moves_every_field_together():
    rows = _rows()
    a = shuffled_rows(rows, 2, seed=7, step=3, process=0)
    again = shuffled_rows(rows, 2, seed=7, step=3, process=0)
    for k in rows:
        np.testing.assert_array_equal(a[k], again[k])
    order = a["tokens_BxL"][:, 0] // 3
    assert sorted(order.tolist()) == list(range(12)) and order.tolist() != list(range(12))
    np.testing.assert_array_equal(a["advantages_B"], order * 0.5)
    others = [shuffled_rows(rows, 2, seed=s, step=t, process=p)["advantages_B"]
              for s, t, p in ((8, 3, 0), (7, 4, 0), (7, 3, 1))]
    assert all(not np.array_equal(o, a["advantages_B"]) for o in others)


def test_which_rows_share_an_update_changes_with_the_step():
    rows = _rows()
    firsts = {tuple(sorted(np.asarray(split_minibatches(
        shuffled_rows(rows, 2, seed=0, step=t, process=0), 2)["advantages_B"][0]).tolist()))
        for t in range(4)}
    assert len(firsts) > 1


def test_one_mini_batch_keeps_the_rows_as_they_are():
    rows = _rows()
    assert shuffled_rows(rows, 1, seed=0, step=0, process=0) is rows

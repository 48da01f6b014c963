"""DA weight transfer without Ray: slices cut from the params cover every row exactly once,
their bytes equal the plan, and a rollout host reassembles the exact weights."""

import numpy as np
import pytest

from compiler import compile_plan
from locojax.config.compose import compose_config
from locojax.disagg.timeline import Interval, overlap_frac, stale_hosts
from locojax.disagg.transfer import SliceAssembler, TransferError, cut_slice, planned_round_bytes


def _plan(*overrides):
    cfg = compose_config(["+experiment=arith_da", "mesh=cpu", *overrides])
    return compile_plan(cfg, None)


def _params(plan, seed=0):
    from compiler.params import param_table

    rng = np.random.default_rng(seed)
    return {p.name: rng.standard_normal(p.shape).astype(np.float32)
            for p in param_table(plan.model.config)}


@pytest.mark.parametrize("hosts,fraction", [(3, 0.67), (4, 0.5), (4, 0.25)])
def test_slices_cover_the_model_and_reassemble_exactly(hosts, fraction):
    plan = _plan(f"mesh.hosts={hosts}", f"placement.rollout_fraction={fraction}")
    flat = _params(plan)
    tp = plan.transfer
    asm = SliceAssembler({n: x.shape for n, x in flat.items()},
                         {n: x.dtype for n, x in flat.items()}, tp.slices)
    moved = 0
    for ws in reversed(tp.slices):  # arrival order does not matter
        pieces = cut_slice(flat, ws)
        assert sum(x.nbytes for x in pieces) == ws.bytes
        moved += asm.add(3, ws.index, pieces)
    assert moved == tp.model_bytes
    out = asm.assemble()
    assert all(np.array_equal(out[n], flat[n]) for n in flat)
    # every rollout host receives every slice once: the plan's total is model bytes x hosts
    assert sum(planned_round_bytes(tp)) == tp.total_bytes == (
        tp.model_bytes * len(plan.partitions.rollout_hosts))


def test_bytes_mismatch_and_missing_slices_are_errors():
    plan = _plan("mesh.hosts=4", "placement.rollout_fraction=0.5")
    flat = _params(plan)
    ws = plan.transfer.slices[0]
    first = ws.pieces[0]
    bad = dict(flat)
    bad[first.name] = flat[first.name].astype(np.float64)
    with pytest.raises(TransferError, match="the plan says"):
        cut_slice(bad, ws)
    asm = SliceAssembler({n: x.shape for n, x in flat.items()},
                         {n: x.dtype for n, x in flat.items()}, plan.transfer.slices)
    asm.add(1, 0, cut_slice(flat, ws))
    if len(plan.transfer.slices) > 1:
        with pytest.raises(TransferError, match="slices"):
            asm.assemble()
    # a newer version discards a partial older one; a late old slice is ignored
    asm.add(2, 0, cut_slice(flat, ws))
    assert asm.add(1, 0, cut_slice(flat, ws)) == 0


def test_overlap_and_staleness_bookkeeping():
    assert overlap_frac(Interval(0, 2), Interval(1, 1.5)) == 1.0
    assert overlap_frac(Interval(0, 2), Interval(1, 3)) == pytest.approx(0.5)
    assert overlap_frac(Interval(0, 1), Interval(2, 3)) == 0.0
    assert stale_hosts(5, {0: 4, 1: 3, 2: 5}, max_staleness=1) == [1]
    assert stale_hosts(5, {0: 4, 1: 3}, max_staleness=0) == [0, 1]

"""The v5e cost constants against the chip: conf/hardware/v5e.yaml's efficiencies are the fit
of a CO run measured on one v5e chip (tests/fixtures/chip/v5e_gsm8k_co: its plan.json and
metrics rows as the run wrote them), and the plan under them predicts that run's step.

The compiled programs' fit (tests/compiler/test_roofline_fit.py) takes a program to run at the
chip's peak, so the chip's train efficiency lies below it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from paths import FIXTURES

from compiler.cost.fit import fit_runs, measured_phases, predicted_phases
from compiler.cost.roofline import fitted
from locojax.config.compose import compose_config
from locojax.reports.calibration import load_run

RUN = FIXTURES / "chip" / "v5e_gsm8k_co"
EFFICIENCIES = ("decode_efficiency", "prefill_efficiency", "train_efficiency")


def _v5e():
    return compose_config(["mesh=v5e"]).hardware.cost


def test_the_v5e_efficiencies_are_the_fit_of_the_chip_run():
    plan, rows = load_run(RUN)
    assert plan.topology.accelerator == "v5e" and len(rows) == 3
    fit, _ = fit_runs([(plan, measured_phases(rows, skip=1))], plan.topology.hardware.cost)
    for name in EFFICIENCIES:
        assert getattr(_v5e(), name) == pytest.approx(getattr(fit, name), rel=1e-3), name


def test_the_plan_predicts_the_chip_run_within_a_quarter():
    plan, rows = load_run(RUN)
    measured = measured_phases(rows, skip=1)
    predicted = predicted_phases(plan, replace(plan.topology.hardware.cost,
                                               **{n: getattr(_v5e(), n) for n in EFFICIENCIES}))
    for phase in ("rollout", "train", "step"):
        assert getattr(predicted, phase) == pytest.approx(getattr(measured, phase), rel=0.25)


def test_the_chip_trains_below_the_compiled_programs_ceiling():
    from test_roofline_fit import _rows

    ceiling = fitted(r["train_efficiency"] for r in _rows() if r["gen"] == "v5e")
    assert _v5e().train_efficiency < ceiling

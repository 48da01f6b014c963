"""Calibration: fit a hardware entry's cost constants to the phase times of a measured run.

A run writes its plan (`plan.json`) and one metrics row per step. The measured phase is the
median over the steps after the first `skip` (compilation); the predicted one is the plan's
own mode (`ExecutionPlan.cost_mode`) from `compiler.cost.estimate.estimate_plan`, re-evaluated
with candidate constants. Phases:

- rollout  <- rollout_s;
- detok    <- host_detok_s, score <- host_score_s, batch <- host_batch_s (the host work the
  runs time by kind, `locojax.runtime.hostwork`);
- gather   <- host_gather_s + host_scatter_s (the single controller's completions in and rows
  out; a local controller's statistics all-gather is not modelled, predicted 0);
- dispatch <- host_dispatch_s (the single controller's call round trips; a CO run measures
  none);
- train    <- train_s (predicted: train + network, one jitted global step with its
  collectives; network also holds the rollout tensor-parallel all-reduces when tp > 1);
- transfer <- transfer_s;
- step     <- step_s.

Each constant is fitted by log-bisection so that the phase it drives matches (every phase is
monotone in its constant): network_efficiency on transfer (first: it also moves train),
dispatch_s on dispatch (single-controller runs), detok_s_per_token on detok, the run's reward
kind's score_<kind>_s_per_sample on score, encode_s_per_token on batch (prompt tokenising is
most of the batch phase at the sizes runs on one machine have; the rows' batch_s_per_token,
a memory-bound numpy rate, is not told apart from it and stays as it is), decode and prefill
efficiency scaled by one factor on rollout (one run cannot tell them apart), train_efficiency
on train.
A phase the model predicts as zero, or measured as zero, keeps its constant. Several runs
share one set of constants: each constant takes the geometric mean of the factors the runs
need alone. A single-controller run also sets dispatches_per_step to the calls per worker per
step it counted (`host_dispatches`; a count, not a fit). Runs of two or more model sizes also
fit the fixed per-layer costs decode_layer_s (rollout) and train_layer_s (train), each jointly
with its phase's efficiency by least squares in log time (a grid over the overhead, then a
golden-section refinement): small models are overhead-bound, large ones rate-bound, so one
size alone cannot separate the two. collective_latency_s, local_dispatch_s and
dispatch_tree_arity are never fitted; nor is the gather (latency-bound on one machine).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from math import exp, log

from compiler.config import ControllerKind, CostConstants, HardwareSpec
from compiler.cost.estimate import estimate_plan
from compiler.plan import ExecutionPlan

PHASES = ("rollout", "detok", "score", "batch", "gather", "dispatch", "train", "transfer",
          "step")
"""Compared phases, in table order."""
MEASURED_KEYS = {"rollout": ("rollout_s",), "detok": ("host_detok_s",),
                 "score": ("host_score_s",), "batch": ("host_batch_s",),
                 "gather": ("host_gather_s", "host_scatter_s"),
                 "dispatch": ("host_dispatch_s",), "train": ("train_s",),
                 "transfer": ("transfer_s",), "step": ("step_s",)}
"""metrics.jsonl keys summed into each phase."""
EFFICIENCY_RANGE = (1e-6, 1.0)
"""Fitted efficiencies stay fractions of peak."""
SECONDS_RANGE = (1e-9, 10.0)
"""Bounds of fitted per-dispatch and per-sample seconds."""


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds of each phase of one step."""

    rollout: float
    detok: float
    score: float
    batch: float
    gather: float
    dispatch: float
    train: float
    transfer: float
    step: float
    dispatches: float = 0.0
    """Driver-to-worker calls per step, all workers together (measured runs only)."""


@dataclass(frozen=True)
class Fit:
    """The fitted constants and what they predict, next to the original prediction."""

    constants: CostConstants
    before: PhaseTimes
    after: PhaseTimes
    measured: PhaseTimes
    notes: tuple[str, ...]
    """Constants left as they were, or pinned at a bound, and why."""


def measured_phases(rows: Sequence[Mapping[str, float]], skip: int = 1) -> PhaseTimes:
    """Median seconds per phase over the rows after the first `skip` (compile) steps."""
    kept = list(rows[skip:]) or list(rows)
    if not kept:
        raise ValueError("no metrics rows to calibrate on")
    med = {p: statistics.median(sum(float(r.get(k, 0.0)) for k in keys) for r in kept)
           for p, keys in MEASURED_KEYS.items()}
    return PhaseTimes(**med, dispatches=statistics.median(float(r.get("host_dispatches", 0))
                                                          for r in kept))


def predicted_phases(plan: ExecutionPlan, cost: CostConstants | None = None) -> PhaseTimes:
    """The cost model's phase times of the plan's mode with `cost` (default: the plan's)."""
    m = getattr(estimate_plan(plan, cost), plan.cost_mode)
    if not m.feasible:
        raise ValueError(f"the plan's mode cannot run under these constants: {m.note}")
    return PhaseTimes(rollout=m.rollout_s, detok=m.detok_s, score=m.score_s, batch=m.batch_s,
                      gather=m.gather_s, dispatch=m.dispatch_s, train=m.train_s + m.network_s,
                      transfer=m.transfer_s, step=m.step_s)


def _bisect_log(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """x in [lo, hi] with f(x) = target for a monotone f, by bisection in log space."""
    f_lo, f_hi = f(lo), f(hi)
    increasing = f_hi >= f_lo
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-12:
            break
    return (lo * hi) ** 0.5


# (phase, constants it scales together, bounds): fitted in this order.
KNOBS: tuple[tuple[str, tuple[str, ...], tuple[float, float]], ...] = (
    ("transfer", ("network_efficiency",), EFFICIENCY_RANGE),
    ("dispatch", ("dispatch_s",), SECONDS_RANGE),
    ("detok", ("detok_s_per_token",), SECONDS_RANGE),
    ("score", ("score_gsm8k_s_per_sample",), SECONDS_RANGE),
    ("score", ("score_boxed_s_per_sample",), SECONDS_RANGE),
    ("batch", ("encode_s_per_token",), SECONDS_RANGE),
    ("rollout", ("decode_efficiency", "prefill_efficiency"), EFFICIENCY_RANGE),
    ("train", ("train_efficiency",), EFFICIENCY_RANGE),
)


def _scaled(c: CostConstants, names: tuple[str, ...], factor: float) -> CostConstants:
    return replace(c, **{n: getattr(c, n) * factor for n in names})


def _factor(plan: ExecutionPlan, c: CostConstants, phase: str, names: tuple[str, ...],
            bounds: tuple[float, float], target: float) -> float | None:
    """The factor on `names` that makes `phase` of `plan` equal `target` (None: no effect)."""
    base = [getattr(c, n) for n in names]
    now = getattr(predicted_phases(plan, c), phase)
    if target <= 0 or now <= 0 or min(base) <= 0:
        return None
    if getattr(predicted_phases(plan, _scaled(c, names, 2.0)), phase) == now:
        return None  # the phase does not depend on them here (another reward kind, CO dispatch)
    # The factor keeps every scaled constant inside its bounds.
    lo, hi = max(bounds[0] / b for b in base), min(bounds[1] / b for b in base)
    return _bisect_log(lambda k: getattr(predicted_phases(plan, _scaled(c, names, k)), phase),
                       target, lo, hi)


OVERHEADS = {"rollout": "decode_layer_s", "train": "train_layer_s"}
"""Each phase's fixed per-layer cost, fitted with its efficiency when runs differ in size."""
OVERHEAD_GRID = tuple(10.0 ** (e / 4) for e in range(-32, -3))
"""Candidate per-layer seconds (1e-8 .. 0.1, four per decade) besides 0, then refined."""


def _sizes(runs: Sequence[tuple[ExecutionPlan, PhaseTimes]]) -> int:
    return len({(p.model.config.hidden, p.model.config.num_layers, p.model.config.vocab,
                 p.model.config.ffn) for p, _ in runs})


def _log_error(runs, c: CostConstants, phase: str) -> float:
    """Squared log error of `phase` over the runs (what an overhead fit minimises)."""
    total = 0.0
    for plan, m in runs:
        want, got = getattr(m, phase), getattr(predicted_phases(plan, c), phase)
        if want > 0 and got > 0:
            total += log(got / want) ** 2
    return total


def _fit_knob(runs, c: CostConstants, knob, notes: list[str]) -> CostConstants:
    """Scale the knob's constants by the geometric mean of the factors each run needs."""
    phase, names, bounds = knob
    factors = [k for plan, m in runs
               if (k := _factor(plan, c, phase, names, bounds, getattr(m, phase)))]
    if not factors:
        notes.append(f"{'/'.join(names)} kept: no run predicts and measures {phase} > 0")
        return c
    c = _scaled(c, names, exp(sum(log(k) for k in factors) / len(factors)))
    for plan, m in runs:
        got, want = getattr(predicted_phases(plan, c), phase), getattr(m, phase)
        if len(runs) == 1 and want > 0 and abs(got - want) > 1e-3 * want:
            notes.append(f"{'/'.join(names)} at a bound: {phase} predicted {got:.3g} s, "
                         f"measured {want:.3g} s")
    return c


def _fit_with_overhead(runs, c: CostConstants, knob, notes: list[str]) -> CostConstants:
    """The phase's per-layer overhead and efficiency minimising its log error over the runs:
    a grid over the overhead, each point with the efficiency fitted, then a golden-section
    refinement in log space around the best point."""
    name = OVERHEADS[knob[0]]

    def at(overhead: float) -> tuple[float, CostConstants]:
        fitted = _fit_knob(runs, replace(c, **{name: overhead}), knob, [])
        return _log_error(runs, fitted, knob[0]), fitted

    (best_err, best), best_o = min(((at(o), o) for o in (0.0, *OVERHEAD_GRID)),
                                   key=lambda t: t[0][0])
    if best_o > 0:
        lo, hi = log(best_o) - log(10.0) / 4, log(best_o) + log(10.0) / 4
        golden = (5 ** 0.5 - 1) / 2
        a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
        fa, fb = at(exp(a))[0], at(exp(b))[0]
        for _ in range(30):  # each round keeps one of its two points: one new evaluation
            if fa < fb:
                hi, b, fb = b, a, fa
                a = hi - golden * (hi - lo)
                fa = at(exp(a))[0]
            else:
                lo, a, fa = a, b, fb
                b = lo + golden * (hi - lo)
                fb = at(exp(b))[0]
        err, fitted = at(exp((lo + hi) / 2))
        best = fitted if err < best_err else best
    return _fit_knob(runs, best, knob, notes)


def _counted_dispatches(runs, c: CostConstants) -> CostConstants:
    """dispatches_per_step from the single-controller runs' counted calls per worker."""
    counts = [m.dispatches / p.topology.hosts for p, m in runs
              if p.controller.kind == ControllerKind.single and m.dispatches > 0]
    return replace(c, dispatches_per_step=max(round(statistics.median(counts)), 1)) if (
        counts) else c


def fit_runs(runs: Sequence[tuple[ExecutionPlan, PhaseTimes]],
             start: CostConstants) -> tuple[CostConstants, tuple[str, ...]]:
    """One set of constants for several runs: per constant, the geometric mean of the factors
    each run alone needs (least squares in log time when a phase is proportional to it).

    With runs of two or more model sizes, the rollout and train phases also get their fixed
    per-layer costs (decode_layer_s, train_layer_s), fitted jointly with their efficiencies;
    runs of one size cannot tell a fixed cost from a rate, so those stay as they were."""
    notes: list[str] = []
    c, sizes = _counted_dispatches(runs, start), _sizes(runs)
    for knob in KNOBS:
        if knob[0] in OVERHEADS and sizes >= 2:
            c = _fit_with_overhead(runs, c, knob, notes)
        else:
            c = _fit_knob(runs, c, knob, notes)
    if sizes < 2:
        notes.append("decode_layer_s/train_layer_s kept: fitting them needs runs of two "
                     "model sizes")
    return c, tuple(notes)


def fit_constants(plan: ExecutionPlan, measured: PhaseTimes,
                  start: CostConstants | None = None) -> Fit:
    """Constants under which the plan's predicted phases match `measured` (see module doc)."""
    start = start or plan.topology.hardware.cost
    c, notes = fit_runs([(plan, measured)], start)
    return Fit(constants=c, before=predicted_phases(plan, start),
               after=predicted_phases(plan, c), measured=measured, notes=notes)


def calibrated_hardware(hw: HardwareSpec, c: CostConstants, name: str,
                        source: str) -> HardwareSpec:
    """The hardware entry `hw` renamed, with the fitted constants and their source."""
    return replace(hw, name=name, cost=replace(c, source=source))


def summary(c: CostConstants) -> str:
    """The fitted constants on one line (for `source`)."""
    return ", ".join(f"{f.name}={getattr(c, f.name):.4g}" for f in fields(c)
                     if f.name not in ("source", "dispatches_per_step", "dispatch_tree_arity"))


def _rel(pred: float, meas: float) -> str:
    return f"{(pred - meas) / meas:+.0%}" if meas > 0 else "n/a"


def comparison_table(rows: Sequence[tuple[str, PhaseTimes]], measured: PhaseTimes) -> str:
    """Predicted vs measured seconds per phase, with the relative error of each prediction."""
    head = f"{'phase':<9} {'measured':>10}" + "".join(
        f" {label:>12} {'err':>6}" for label, _ in rows)
    lines = [head, "-" * len(head)]
    for p in PHASES:
        m = getattr(measured, p)
        cells = "".join(f" {getattr(t, p):>12.4g} {_rel(getattr(t, p), m):>6}" for _, t in rows)
        lines.append(f"{p:<9} {m:>10.4g}{cells}")
    return "\n".join(lines)

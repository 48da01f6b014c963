"""Pass 1: host partitions. Which hosts roll out and which train.

CO: every host does both. DA: r = floor(rollout_fraction * hosts + 0.5) rollout hosts, the
rest train. Rollout hosts are the first r host indices and trainers the rest: contiguous
blocks keep each role on neighbouring hosts of a TPU torus (shorter ICI paths inside a role;
the weight transfer is the only traffic between the blocks).

`placement.mode=auto` compiles every `candidate_placements` entry (CO and the DA splits of
`AUTO_FRACTIONS`) and keeps the one the cost model predicts fastest (CO on ties).
"""

from __future__ import annotations

from compiler.config import (
    AlgorithmConfig,
    ControllerConfig,
    ControllerKind,
    LoraWarmup,
    OldLogprobs,
    PlacementConfig,
    PlacementMode,
)
from compiler.errors import PlanError
from compiler.plan import Partitions, PlacementSummary, Topology

AUTO_FRACTIONS = (0.25, 0.5, 0.75)
"""Rollout fractions the auto placement tries for DA."""


def rollout_host_count(fraction: float, hosts: int) -> int:
    """Rollout hosts of a DA split: the fraction of hosts, rounded half up."""
    return int(fraction * hosts + 0.5)


def colocated(topo: Topology) -> Partitions:
    """Every host rolls out and trains."""
    everyone = tuple(range(topo.hosts))
    return Partitions(rollout_hosts=everyone, trainer_hosts=everyone,
                      rollout_devices=topo.devices, trainer_devices=topo.devices)


def disaggregated(fraction: float, topo: Topology) -> Partitions:
    """The first `fraction` of hosts roll out, the rest train."""
    if not 0.0 < fraction < 1.0:
        raise PlanError("placement.rollout_fraction", fraction,
                        "must lie strictly between 0 and 1 for disaggregated placement",
                        "fraction_range")
    r = rollout_host_count(fraction, topo.hosts)
    if r < 1 or r >= topo.hosts:
        role = "rollout" if r < 1 else "trainer"
        raise PlanError("placement.rollout_fraction", fraction,
                        f"floor({fraction} x {topo.hosts} hosts + 0.5) = {r} rollout hosts "
                        f"leaves the {role} role no host (DA needs at least 2 hosts)",
                        "role_without_host")
    per = topo.devices_per_host
    return Partitions(rollout_hosts=tuple(range(r)), trainer_hosts=tuple(range(r, topo.hosts)),
                      rollout_devices=r * per, trainer_devices=(topo.hosts - r) * per)


def candidate_placements(p: PlacementConfig, controller: ControllerConfig,
                         topo: Topology) -> tuple[PlacementSummary, ...]:
    """Placements `placement.mode=auto` may choose from: CO and each valid DA split."""
    _check_staleness(p)
    out = [PlacementSummary(PlacementMode(p.mode), PlacementMode.colocated,
                            float(p.rollout_fraction), 0)]
    if controller.kind == ControllerKind.single:
        return tuple(out)
    staleness = max(p.max_staleness, 0)
    for fraction in AUTO_FRACTIONS:
        if 1 <= rollout_host_count(fraction, topo.hosts) < topo.hosts:
            out.append(PlacementSummary(PlacementMode(p.mode), PlacementMode.disaggregated,
                                        fraction, staleness))
    return tuple(out)


def _check_staleness(p: PlacementConfig) -> None:
    if p.max_staleness < 0:
        raise PlanError("placement.max_staleness", p.max_staleness, "must be >= 0", "positive")


def resolve_placement(p: PlacementConfig, controller: ControllerConfig) -> PlacementSummary:
    """The placement a CO or DA config asks for (auto goes through `candidate_placements`)."""
    _check_staleness(p)
    if p.mode == PlacementMode.disaggregated:
        if controller.kind == ControllerKind.single:
            raise PlanError("controller", controller.kind,
                            "the single controller supports only placement.mode=colocated, "
                            "not disaggregated", "controller_placement")
        return PlacementSummary(PlacementMode(p.mode), PlacementMode(p.mode),
                                float(p.rollout_fraction), p.max_staleness)
    return PlacementSummary(PlacementMode(p.mode), PlacementMode.colocated,
                            float(p.rollout_fraction), 0)


def check_stale_correction(algorithm: AlgorithmConfig, placement: PlacementSummary) -> None:
    """Refuse DA training on lagged samples without the behaviour weight: with pi_old
    recomputed by the trainer, the clipped ratio never sees the policy that sampled."""
    if (placement.mode == PlacementMode.disaggregated and placement.max_staleness > 0
            and algorithm.old_logprobs == OldLogprobs.recompute
            and not algorithm.rollout_logp):
        raise PlanError("algorithm.rollout_correction", algorithm.rollout_correction,
                        f"placement.max_staleness={placement.max_staleness} lets DA samples lag "
                        "the trainer, and old_logprobs=recompute takes pi_old from the trainer: "
                        "set rollout_correction=tis (or mis, seq_tis, seq_mis) so each token is "
                        "weighted by pi_old / pi_behaviour, or old_logprobs=rollout, or "
                        "max_staleness=0", "stale_uncorrected")


def check_lora_warmup(algorithm: AlgorithmConfig, placement: PlacementSummary) -> None:
    """Refuse DA with a whole-model LoRA warm-up: its rollout hosts read the base themselves
    and receive adapters only, so they would merge them onto the base before the warm-up."""
    lora = algorithm.lora
    if (placement.mode == PlacementMode.disaggregated and lora.rank > 0
            and lora.warmup == LoraWarmup.full and algorithm.sft_warmup_steps > 0):
        raise PlanError("algorithm.lora.warmup", str(lora.warmup),
                        "a whole-model warm-up changes the base, and DA's rollout hosts read "
                        "the base themselves and receive adapters only: use "
                        "placement=colocated, or algorithm.lora.warmup=adapters",
                        "lora_warmup_da")


def partition(placement: PlacementSummary, topo: Topology) -> Partitions:
    """Host partitions of a resolved placement."""
    if placement.mode == PlacementMode.disaggregated:
        return disaggregated(placement.rollout_fraction, topo)
    return colocated(topo)

"""Characterization: where a single controller's step time goes, per model size.

For each model the machine is the smallest valid chip count (TPU slice sizes, whole GPU
hosts) of at least `min_hosts` hosts that the compiler accepts for a colocated step under
the single controller (its sharding and batching passes check memory), and the plan's cost
estimate splits that step into compute, host, network and transfer shares. `min_hosts`
defaults to 2: on one host the single controller and a local one run the same program, so
the overhead under study needs two. `calibrate_dispatch_s` fits the one free constant of
the host term to a measured host share.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from compiler.axes import MeshAxis
from compiler.config import (
    AlgorithmConfig,
    Config,
    ControllerConfig,
    ControllerKind,
    HardwareSpec,
    MeshConfig,
    MeshKind,
    ModelConfig,
    PlacementConfig,
    PlacementMode,
    WorkloadConfig,
)
from compiler.cost import phases as ph
from compiler.hardware import min_chips_for_training
from compiler.params import param_count
from compiler.pipeline import compile_plan, compile_smallest
from compiler.plan import ExecutionPlan


@dataclass(frozen=True)
class CharacterizationRow:
    """One model's single-controller step on its smallest fitting machine."""

    model: str
    params: int
    min_chips_for_training: int
    """Smallest valid chip count whose HBM holds the training state alone."""
    chips: int
    """Chips used: the smallest valid count >= min_hosts hosts that the compiler accepts."""
    hosts: int
    fsdp_devices: int
    rollout_tensor_parallel: int
    rollout_waves: int
    micro_batches: int
    step_s: float
    compute_share: float
    host_share: float
    network_share: float
    transfer_share: float


def single_controller_config(model: ModelConfig, hardware: HardwareSpec,
                             workload: WorkloadConfig, chips: int,
                             algorithm: AlgorithmConfig | None = None) -> Config:
    """The baseline: a colocated step on `chips` chips driven by one controller."""
    kind = MeshKind.tpu if hardware.platform == "tpu" else MeshKind.gpu
    return Config(model=model, workload=workload, hardware=hardware,
                  mesh=MeshConfig(kind=kind, chips=chips),
                  placement=PlacementConfig(mode=PlacementMode.colocated,
                                            rollout_fraction=1.0, max_staleness=0),
                  controller=ControllerConfig(kind=ControllerKind.single),
                  algorithm=algorithm or AlgorithmConfig())


def smallest_plan(model: ModelConfig, hardware: HardwareSpec, workload: WorkloadConfig,
                  min_hosts: int = 2, algorithm: AlgorithmConfig | None = None) -> ExecutionPlan:
    """The single-controller plan on the fewest chips (>= `min_hosts` hosts) that compiles.

    The same search as `mesh.chips=0` (`compiler.pipeline.compile_smallest`).
    """
    return compile_smallest(single_controller_config(model, hardware, workload, 0, algorithm),
                            min_hosts)


def characterize(models: tuple[ModelConfig, ...], hardware: HardwareSpec,
                 workload: WorkloadConfig, min_hosts: int = 2,
                 algorithm: AlgorithmConfig | None = None) -> tuple[CharacterizationRow, ...]:
    """Compute/host/network shares of the single controller's step for each model."""
    rows = []
    for model in models:
        plan = smallest_plan(model, hardware, workload, min_hosts, algorithm)
        single = plan.cost.single
        rows.append(CharacterizationRow(
            model=model.name, params=param_count(model),
            min_chips_for_training=min_chips_for_training(model, hardware, algorithm),
            chips=plan.topology.chips, hosts=plan.topology.hosts,
            fsdp_devices=plan.sharding.train.mesh[MeshAxis.FSDP],
            rollout_tensor_parallel=plan.sharding.rollout.mesh[MeshAxis.TENSOR],
            rollout_waves=single.rollout_waves,
            micro_batches=single.micro_batches, step_s=single.step_s,
            compute_share=single.compute_share, host_share=single.host_share,
            network_share=single.network_share, transfer_share=single.transfer_share))
    return tuple(rows)


def calibrate_dispatch_s(cfg: Config, host_share: float) -> float:
    """The `dispatch_s` at which the single controller's host share of `cfg`'s plan is `host_share`.

    Host and step seconds are H0 + k d and S0 + k d, k = dispatches_per_step x dispatch rounds
    to reach the hosts (`compiler.cost.phases.dispatch_rounds`) and H0,
    S0 their values at d = 0, so the share s is reached at d = (s S0 - H0) / (k (1 - s)).
    """
    hw = cfg.hardware
    plan = compile_plan(replace(cfg, hardware=replace(hw, cost=replace(hw.cost, dispatch_s=0.0))))
    base = plan.cost.single
    k = hw.cost.dispatches_per_step * ph.dispatch_rounds(cfg, plan.topology.hosts)
    d = (host_share * base.step_s - base.host_s) / (k * (1.0 - host_share))
    if d < 0:
        raise ValueError(f"the host share is already {base.host_s / base.step_s:.3f} > "
                         f"{host_share} at dispatch_s=0")
    return d

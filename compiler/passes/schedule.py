"""Pass 5: the step schedule. Ordered phases of one RL step and their overlaps.

- CO (local controller): every host rolls out, scores and computes advantages for its own
  prompts; the train step is the one global program; the transfer is an on-host reshard.
- Single controller: the same order, but rewards and advantages run on the controller.
- DA: rollout hosts sample, score and compute advantages; trainer hosts train; then weights
  move to the rollout hosts. With `max_staleness >= 1`, rollout, reward and advantage of step
  t+1 run while step t trains (samples lag the weights by one version); the transfer then
  lands between two rollout batches.
"""

from __future__ import annotations

from compiler.config import ControllerConfig, ControllerKind, PlacementMode
from compiler.plan import Overlap, Phase, PhaseSpec, PlacementSummary, Role, StepSchedule

_SAMPLING = (Phase.rollout, Phase.reward, Phase.advantage)


def schedule(controller: ControllerConfig, placement: PlacementSummary) -> StepSchedule:
    """Phases of one step for the placement and controller."""
    if placement.mode == PlacementMode.disaggregated:
        phases = tuple(PhaseSpec(p, Role.rollout_hosts, False) for p in _SAMPLING) + (
            PhaseSpec(Phase.train, Role.trainer_hosts, True),
            PhaseSpec(Phase.transfer, Role.all_hosts, True))
        overlaps = ()
        if placement.max_staleness >= 1:
            overlaps = tuple(Overlap(p, Phase.train, 1) for p in _SAMPLING)
        return StepSchedule(phases, overlaps)
    single = controller.kind == ControllerKind.single
    central = Role.controller if single else Role.all_hosts
    phases = (PhaseSpec(Phase.rollout, Role.all_hosts, single),
              PhaseSpec(Phase.reward, central, False),
              PhaseSpec(Phase.advantage, central, False),
              PhaseSpec(Phase.train, Role.all_hosts, True),
              PhaseSpec(Phase.transfer, Role.all_hosts, False))
    return StepSchedule(phases, ())

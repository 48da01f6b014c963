"""`python -m locojax.eval`: greedy accuracy (k = 1), or pass@1, pass@k and maj@k of k samples,
of a checkpoint on a workload's split.

    python -m locojax.eval +experiment=gsm8k_co model=hf eval.checkpoint=<hf dir> \\
        eval.samples=8 sampling.temperature=1.0
    python -m locojax.eval +experiment=arith_co eval.checkpoint=<run dir> eval.samples=4
        (a run directory: its latest checkpoint step, or `eval.step=N`; else its hf/ export)

Writes `samples.jsonl` (one row per prompt: its completions and scores) and `summary.json`
to `eval.out`, and prints the summary as the last line of stdout (`greedy_accuracy`, or
`pass@1`, `pass@<k>`, `maj@<k>`; `mean_length`, `truncation_rate`; a reward of the user's that
leaves correctness unknown gives no score keys, and a line at start says so). The same
command on every host of a cluster joins one job, as `python -m locojax` does, and the hosts share the
prompts (host 0 writes and prints); `mesh=cpu mesh.hosts=N` emulates N hosts on this
machine.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import hydra
from omegaconf import DictConfig

from compiler import compile_plan
from compiler.config import MeshKind
from compiler.model_entry import checkpoint_model
from compiler.passes.ranges import ranges
from locojax.config.compose import CONF_DIR, controller_config, to_config
from locojax.config.resolve import detected_topology
from locojax.eval.score import checked, evaluate
from locojax.launch.door import door, task
from locojax.launch.join import join
from locojax.launch.local import launch_local_hosts
from locojax.rewards.scorer import unjudged_line


@hydra.main(config_path=str(CONF_DIR), config_name="eval", version_base=None)
@task
def main(raw: DictConfig) -> None:
    """Score the checkpoint (this host's share) and print the summary line on host 0 (after
    the line that correctness is unknown, when it is)."""
    formation = join(controller_config(raw), log=lambda _: None,
                     ask_jax=raw.mesh.kind != MeshKind.cpu)
    cfg, source = checked(to_config(raw))
    # model=hf takes its numbers from the checkpoint (eval.checkpoint's, when it is an HF
    # directory) before its ranges are checked
    ranges(dataclasses.replace(cfg, model=checkpoint_model(cfg.model)))
    plan = compile_plan(cfg, detected_topology(cfg))
    topo = plan.topology
    if not formation.joined and topo.mesh_kind == MeshKind.cpu and topo.hosts > 1:
        command = [sys.executable, "-m", "locojax.eval", *sys.argv[1:]]
        sys.exit(launch_local_hosts(topo.hosts, topo.devices_per_host, command,
                                    heartbeat_timeout_s=plan.controller.heartbeat_timeout_s,
                                    port=plan.controller.coordinator_port or None))
    unjudged = unjudged_line(plan.workload)
    if unjudged and formation.host_index == 0:
        print(unjudged, flush=True)
    summary = evaluate(cfg, plan, source, formation.host_index, formation.hosts)
    if summary is not None:
        print(json.dumps(summary), flush=True)


def cli() -> None:
    """The `locojax-eval` command (`[project.scripts]`): `main` behind the door."""
    door(main)

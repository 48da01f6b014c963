"""Where a run's weights, numbers and data come from: the first lines of a run, and
`provenance.json` in its directory.

    weights: random initialisation (run.seed=0): no model.checkpoint
    weights: /data/Qwen3-0.6B (model.checkpoint, fingerprint 3f2a9c01d4e5b6a7)
    weights: the run's checkpoint of step 40 (<run dir>/checkpoints/40), resumed; the run
             started from <the first launch's weights line>
    dtypes: compute float32 (the cpu default: bf16 matmuls are ~12x slower on CPU; model.dtype),
            master weights float32 (model.param_dtype)
    data: gsm8k from /abs/shared/data/gsm8k/train.jsonl (workload.data_dir)
    accuracy: not reported: workload.reward=python without workload.correct or ...
              (only when a reward of the user's leaves correctness unknown)

A published model's architecture (an entry whose `model.source` is a URL, the paper
experiments' `qwen3_0_6b`) without `model.checkpoint` also gets one warning on stderr: it
trains from random weights, which is rarely what was meant. The first launch writes
`provenance.json`; a resume reads it for where the run started. No JAX here: the launcher
runs this before it sets the CPU device count.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from compiler import ExecutionPlan
from compiler.model_entry import platform_dtype
from locojax.hubs import hub_of
from locojax.rewards.scorer import unjudged_line
from locojax.runtime.errors import RunDirError
from locojax.runtime.process.stop import atomic
from locojax.runtime.rundir.files import CHECKPOINTS_DIR, PROVENANCE_FILE, write_atomic
from locojax.runtime.rundir.preflight import checkpoint_steps

SAMPLED_BLOCKS = 64
"""Evenly spaced blocks of each weight file that go into its fingerprint (with its size and
header): a fingerprint in a second for any size, different for any fine-tune."""
BLOCK_BYTES = 1 << 16


def fingerprint(checkpoint: Path) -> str:
    """16 hex digits of sha256 over config.json and, per weight file (name order), its name,
    size, safetensors header and `SAMPLED_BLOCKS` evenly spaced blocks of its data; not a
    hash of every byte (stated as such in docs/fine-tuning.md)."""
    digest = hashlib.sha256((checkpoint / "config.json").read_bytes())
    for path in sorted(checkpoint.glob("*.safetensors")):
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with path.open("rb") as f:
            head = f.read(8)
            header = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            digest.update(f.read(min(header, size)))
            for i in range(SAMPLED_BLOCKS):
                f.seek(size * i // SAMPLED_BLOCKS)
                digest.update(f.read(BLOCK_BYTES))
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Provenance:
    """What a run says it starts from (`provenance.json`)."""

    weights: str
    """Where the weights come from, in words."""
    checkpoint: str | None
    """`model.checkpoint` as an absolute path, or None (random initialisation)."""
    fingerprint: str | None
    """`fingerprint` of that checkpoint."""
    dtypes: str
    """Compute and master dtypes, and why."""
    data: str
    """Where the prompts come from."""

    def lines(self) -> list[str]:
        return [f"weights: {self.weights}", f"dtypes: {self.dtypes}", f"data: {self.data}"]


def _weights(plan: ExecutionPlan) -> tuple[str, str | None, str | None]:
    """(words, checkpoint, fingerprint) of the weights a fresh run starts from."""
    model = plan.model.config
    if model.checkpoint is None:
        return f"random initialisation (run.seed={plan.run.seed}): no model.checkpoint", None, None
    path = Path(os.path.abspath(Path(model.checkpoint).expanduser()))  # `..` folded away
    mark = fingerprint(path)
    return f"{path} (model.checkpoint, fingerprint {mark})", str(path), mark


def _dtypes(plan: ExecutionPlan) -> str:
    """The compute and master dtypes and why (the platform's default, or set)."""
    model, platform = plan.model.config, plan.topology.platform
    default = platform_dtype(platform)
    why = (f"the {platform} default" + (": bf16 matmuls are ~12x slower on CPU"
                                        if platform == "cpu" else "")
           if model.dtype == default else f"set; the {platform} default is {default}")
    return (f"compute {model.dtype} ({why}; model.dtype), master weights {model.param_dtype} "
            "(model.param_dtype)")


def _where(path: str) -> str:
    """A local file's absolute path; anything else (a hub name) as given."""
    local = Path(path).expanduser()
    return os.path.abspath(local) if local.exists() else path


def _data(plan: ExecutionPlan) -> str:
    """Where the prompts come from, without reading them."""
    w = plan.workload
    if w.name == "arith":
        return f"arith, generated in code (run.seed={plan.run.seed}): nothing read or downloaded"
    if w.data_files:
        files = ", ".join(f"{split}: {_where(path)}" for split, path in w.data_files.items())
        return f"{w.name} from {files} (workload.data_files)"
    if (hub := hub_of(w.env)) is not None:
        return (f"{w.name} from the {hub[0].name} environment {hub[1]}'s own rows "
                "(workload.env)")
    if w.reasoning_gym.task:
        g = w.reasoning_gym
        return (f"reasoning-gym task {g.task}, generated ({g.size} train rows from seed "
                f"{g.seed}, {g.eval_size} eval rows from seed {g.seed + 1}): nothing read")
    if w.data_dir is not None:
        root = Path(os.path.abspath(Path(w.data_dir).expanduser()))
        where = root if root.is_file() else root / f"{w.train_split}.jsonl"
        return f"{w.name} from {where} (workload.data_dir)"
    config = f" ({w.dataset_config})" if w.dataset_config else ""
    return (f"{w.name} from the Hugging Face hub: {w.dataset}{config} split {w.train_split} "
            "(workload.dataset; workload.data_dir=<dir> reads local files)")


def random_weights_warning(plan: ExecutionPlan) -> str | None:
    """The warning of a published model's architecture trained from random weights."""
    model = plan.model.config
    if model.checkpoint is not None or not model.source.startswith(("http://", "https://")):
        return None
    return (f"warning: model={model.name} has no model.checkpoint: training starts from random "
            f"weights, not from the published model ({model.source}); pass model=hf "
            "model.checkpoint=<HF dir> to fine-tune it (docs/fine-tuning.md)")


def provenance(plan: ExecutionPlan, run_dir: Path) -> Provenance:
    """What this launch starts from: a resume names the run's newest checkpoint and where the
    run first started (`provenance.json`); a fresh run writes that file."""
    path = run_dir / PROVENANCE_FILE
    steps = checkpoint_steps(run_dir)
    first = _first_launch(path) if steps and path.is_file() else None
    if steps:
        began = f"; the run started from {first['weights']}" if first else ""
        return Provenance(
            weights=f"the run's checkpoint of step {steps[-1]} "
                    f"({run_dir / CHECKPOINTS_DIR / str(steps[-1])}), resumed{began}",
            checkpoint=first and first["checkpoint"], fingerprint=first and first["fingerprint"],
            dtypes=_dtypes(plan), data=_data(plan))
    found = Provenance(*_weights(plan), dtypes=_dtypes(plan), data=_data(plan))
    with atomic():
        write_atomic(path, json.dumps(asdict(found), indent=1) + "\n")
    return found


def _first_launch(path: Path) -> dict:
    """The first launch's `provenance.json`; RunDirError (one line) if it is damaged."""
    try:
        first = json.loads(path.read_text())
    except (OSError, ValueError) as err:  # unreadable, not UTF-8, not JSON
        first = err
    if not (isinstance(first, dict) and isinstance(first.get("weights"), str)
            and all(isinstance(first.get(k, 0), str | None) for k in ("checkpoint",
                                                                       "fingerprint"))):
        raise RunDirError(f"{path}: damaged (not the JSON object of weights, checkpoint and "
                          "fingerprint a run writes when it starts); restore it, or remove it "
                          "to resume without the record of where the run started")
    return first


def announce(plan: ExecutionPlan, run_dir: Path) -> Provenance:
    """Print where the run starts from (stdout, its first lines; then, when the workload
    leaves correctness unknown, that accuracy is not reported) and, for a published model's
    architecture without a checkpoint, the one warning (stderr)."""
    found = provenance(plan, run_dir)
    unjudged = unjudged_line(plan.workload)
    for line in [*found.lines(), *([unjudged] if unjudged else [])]:
        print(line, flush=True)
    warning = random_weights_warning(plan)
    if warning and not checkpoint_steps(run_dir):
        print(warning, file=sys.stderr, flush=True)
    return found

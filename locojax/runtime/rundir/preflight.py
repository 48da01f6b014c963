"""What is checked before a run does any work: its directory, and what that directory holds.

    check_run_dir   a writable directory of this user's own (its owner the effective uid)
                    with room for one checkpoint and the HF export, by
                    the plan's estimate: the training state (`train_state_bytes_per_param` per
                    parameter: parameters and AdamW moments, and their gradients besides) plus
                    the exported parameters (`RunDirError`). Orbax keeps two checkpoints; only
                    one must fit at the start, and a later ENOSPC is reported in one line too
                    (`disk_full` finds it behind Orbax's wrappers).
    check_resume    the first launch in a directory records the resolved configuration
                    (`RECORD_FILE`: the plan's model, workload, algorithm, sampling and run sections
                    as dotted keys, the digests of the user's code and data files and of a
                    checkpoint's own tokenizer); a later launch there is refused
                    (`ResumeRefused`) when a recorded key other than those in `MAY_CHANGE`
                    differs (parameter shapes, optimizer, data, seed, ...; an entry the user
                    added or removed, `USER_KEYED`), or when the directory already holds a
                    checkpoint past `run.steps`. A record that is missing, null, of another
                    type or unparseable falls back to plan.json; when neither reads, a
                    directory that holds anything is refused (never a resume unchecked).
    step_meta       what each checkpoint step's meta records: `CHECKPOINT_FORMAT` and the
                    configuration's fingerprint (`config_fingerprint`, the record less
                    `MAY_CHANGE`); `check_step_meta` refuses a step of another format, step or
                    configuration: the newest step's here (its meta file read as JSON, before
                    plan.json is written), the one restored again in the trainer. Step
                    directories are ASCII digits (`files.step_of`).

Both run before anything is written, so a refused run leaves plan.json and the record as
they were.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import re
import shutil
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compiler import ExecutionPlan, from_data, to_data
from compiler.config import ModelConfig, RunConfig, TokenizerKind
from compiler.model_entry import tokenizer_kind
from compiler.sections import AlgorithmConfig, SamplingConfig, WorkloadConfig
from locojax.hubs import code_of as hub_code_spec
from locojax.rewards.python_fns import fn_digest
from locojax.runtime.errors import ResumeRefused, RunDirError
from locojax.runtime.rundir.files import (
    CHECKPOINTS_DIR,
    PLAN_FILE,
    PROBE_PREFIX,
    RECORD_FILE,
    step_of,
    write_atomic,
)


def checkpoint_bytes(plan: ExecutionPlan) -> int:
    """Bytes of one checkpoint and the HF export, by the plan's estimates."""
    state = plan.model.param_count * plan.sharding.train_state_bytes_per_param
    return int(state + plan.model.param_bytes)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


def check_run_dir(run_dir: Path, need_bytes: int) -> None:
    """Create `run_dir` if needed; `RunDirError` unless it is a writable directory of this
    user's own (another user could change what the run reads back on resume) with
    `need_bytes` free."""
    where = f"hydra.run.dir={run_dir}"
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{where}: not a directory")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunDirError(f"{where}: cannot create it ({err.strerror})") from err
    if not run_dir.is_dir():
        raise RunDirError(f"{where}: not a directory")
    owner, me = run_dir.stat().st_uid, os.geteuid()
    if owner != me:
        raise RunDirError(f"{where}: owned by uid {owner}, not by this user (uid {me}); a run "
                          "directory must be your own: use a new hydra.run.dir")
    probe = run_dir / f"{PROBE_PREFIX}{os.getpid()}"
    try:
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as err:
        raise RunDirError(f"{where}: not writable ({err.strerror})") from err
    free = shutil.disk_usage(run_dir).free
    if free < need_bytes:
        raise RunDirError(f"{where}: {_gib(free)} free, one checkpoint and the HF export need "
                          f"about {_gib(need_bytes)} (the plan's estimate)")


_FULL_TEXT = re.compile(r"No space left on device|Disk quota exceeded|StorageFull|"
                        r"QuotaExceeded|os error (28|122)\b")
"""How libraries that raise no OSError say ENOSPC / EDQUOT: tensorstore's status text,
safetensors' and tokenizers' Rust `io::Error` (`StorageFull`, `os error 28`)."""


def disk_full(err: BaseException) -> OSError | None:
    """The ENOSPC / EDQUOT error behind `err` (Orbax wraps its writers' errors), or None; an
    error whose text says so (`_FULL_TEXT`) counts as one, as an OSError(ENOSPC) of no file."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return err
        text = str(err)
        if _FULL_TEXT.search(text):  # a match: the text is not empty
            return OSError(errno.ENOSPC, text.splitlines()[0][:200])
        err = err.__cause__ or err.__context__
    return None


MAY_CHANGE = (
    "run.steps",
    "run.checkpoint_every",
    "run.eval_every",
    "run.plan_only",
    "run.eval_samples",
    "run.loggers",
    "run.wandb.project",
    "run.wandb.name",
    "run.wandb.tags",
    "run.wandb.mode",
    "run.mlflow.tracking_uri",
    "run.mlflow.experiment",
    "run.mlflow.run_name",
    "model.name",
    "model.source",
    "model.checkpoint",
    "model.export_dtype",
    "workload.eval_prompts",
    "workload.reward_timeout_s",
    "sampling.slots",
    "sampling.schedule",
    "sampling.cpu_kernels",
    "algorithm.remat",
    "run.reuse_dir",
)
"""Keys a resumed run may change: length and bookkeeping, labels, where initial weights came
from (used only before the first checkpoint), and settings that change speed or memory, not
the numbers. Machine, placement and controller are not recorded: a run may resume on another
mesh (Orbax restores onto the new shardings)."""
SHOWN = 6
"""Differences named in the refusal line; the rest are counted."""


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: data}


def _file_sha256(path: str) -> str:
    """sha256 of the file at `path`, "missing" when there is none."""
    p = Path(path).expanduser()
    if not p.is_file():
        return "missing"
    digest = hashlib.sha256()
    with p.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


DIGEST_KEYS = ("workload.reward_fn_sha256.", "workload.tool_sha256.", "workload.env_sha256",
               "workload.data_file_sha256.", "model.tokenizer_sha256")
"""The record's keys of file digests (`file_digests`), by prefix."""


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
"""A checkpoint's files that make its tokenizer: ids, special tokens and template, stops."""


def tokenizer_digest(plan: ExecutionPlan) -> dict[str, str]:
    """{"model.tokenizer_sha256" (`DIGEST_KEYS`): sha256} of `TOKENIZER_FILES` (names and
    contents) when the run's tokenizer is model.checkpoint's own
    (`compiler.model_entry.tokenizer_kind`, the rule `assemble.tokenizer_for` loads by); {} for
    the built-in ones, which the package fixes."""
    model = plan.model.config
    root = Path(model.checkpoint).expanduser() if model.checkpoint else None
    if (tokenizer_kind(model) != TokenizerKind.checkpoint or root is None
            or not (root / "tokenizer.json").is_file()):
        return {}
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        if (root / name).is_file():
            digest.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    return {DIGEST_KEYS[-1]: digest.hexdigest()}


def file_digests(plan: ExecutionPlan) -> dict[str, str]:
    """{record key: sha256} of the files the run's workload reads, by content: its reward
    functions', environment's and tools' code (`fn_digest`: the named file, or the module's)
    and its data files, and a checkpoint's own tokenizer (`tokenizer_digest`). What was
    trained on; and what every host of a run must hold alike."""
    w = plan.workload
    fns, tools, env, data, _ = DIGEST_KEYS
    code = {f"{fns}{name}": spec for name, spec in w.reward_fns.items()}
    code |= {f"{tools}{name}": spec for name, spec in w.tools.items()}
    code |= {env: hub_code_spec(w.env)} if w.env else {}
    return ({key: fn_digest(spec) for key, spec in code.items()}
            | {f"{data}{split}": _file_sha256(path)
               for split, path in w.data_files.items()}
            | tokenizer_digest(plan))


def record_of(plan: ExecutionPlan) -> dict[str, Any]:
    """{dotted key: value} of the configuration the plan was compiled from (the recorded part)
    and the contents of the files it names (`file_digests`)."""
    sections = {"model": plan.model.config, "workload": plan.workload,
                "algorithm": plan.algorithm, "sampling": plan.sampling, "run": plan.run}
    return _flat(to_data(sections)) | file_digests(plan)


REQUIRED = ("run.seed", "run.steps", "model.name", "workload.name")
"""Keys every record holds (any version): a JSON object without them records nothing."""


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def _read_record(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the record in `path`, "") or (None, why it is not one; "" when there is no file)."""
    if not os.path.lexists(path):
        return None, ""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return None, f"unreadable ({type(err).__name__}: {str(err)[:80]})"
    if not isinstance(data, dict):
        return None, f"holds {json.dumps(data)[:40]}, not a JSON object"
    bad = next((k for k, v in data.items()
                if not (_scalar(v) or isinstance(v, list) and all(map(_scalar, v)))), None)
    missing = [k for k in REQUIRED if k not in data]
    if bad is not None or missing:
        return None, (f"{bad} is not a value" if bad is not None
                      else f"lacks {', '.join(missing)}")
    return data, ""


def _read_plan(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the record of the plan in `path`, "") or (None, why not; "" when there is none)."""
    if not os.path.lexists(path):
        return None, ""
    try:
        return record_of(from_data(ExecutionPlan, json.loads(path.read_text()))), ""
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        return None, f"unreadable ({type(err).__name__}: {str(err)[:80]})"


def _recorded(run_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """(the record of an earlier launch, a warning): its own file, else (missing or damaged)
    the record of the plan.json the last launch wrote; None when the directory holds neither
    and no checkpoint. `ResumeRefused` when it holds something and neither can be read: a
    resume is never waved through unchecked."""
    found, why = _read_record(run_dir / RECORD_FILE)
    from_plan, why_plan = _read_plan(run_dir / PLAN_FILE)
    if found is not None:
        return found, why_plan and (f"warning: {run_dir / PLAN_FILE}: {why_plan}; the resume "
                                    f"was checked against {RECORD_FILE}, and the plan is "
                                    "written again")
    if from_plan is not None:
        return from_plan, why and (f"warning: {run_dir / RECORD_FILE}: {why}; the resume was "
                                   f"checked against {PLAN_FILE} instead, and the record is "
                                   "written again")
    if why or why_plan or checkpoint_steps(run_dir):
        raise ResumeRefused(
            f"{run_dir}: what configuration made it is unknown ({RECORD_FILE}: "
            f"{why or 'missing'}; {PLAN_FILE}: {why_plan or 'missing'}), so it cannot be "
            "resumed; use a new hydra.run.dir")
    return None, ""


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Fully written checkpoint steps (Orbax's unfinished saves carry a tmp suffix; a name of
    anything but ASCII digits is no step)."""
    root = run_dir / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    return sorted(s for s in map(step_of, os.listdir(root)) if s is not None)


def _map_fields(cls: type, prefix: str) -> tuple[str, ...]:
    """Dotted prefixes of the `dict` fields of dataclass `cls` and of the dataclasses it
    holds: maps whose keys the user names (reward functions, weights, data files, tools)."""
    hints = typing.get_type_hints(cls)
    found: list[str] = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if typing.get_origin(kind) is dict:
            found.append(f"{prefix}{f.name}.")
        elif dataclasses.is_dataclass(kind):
            found.extend(_map_fields(kind, f"{prefix}{f.name}."))
    return tuple(found)


USER_KEYED = (*_map_fields(ModelConfig, "model."), *_map_fields(WorkloadConfig, "workload."),
              *_map_fields(AlgorithmConfig, "algorithm."),
              *_map_fields(SamplingConfig, "sampling."), *_map_fields(RunConfig, "run."),
              *DIGEST_KEYS)
"""Recorded keys a user adds or removes (an entry of a map the configuration holds, a file's
digest): one side holding such a key is a change. Any other key only one side holds came
with another version of the code, which may add settings."""
ABSENT = "(absent)"


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Recorded keys that differ, `USER_KEYED` ones added or removed included."""
    keys = [k for k in sorted(set(old) | set(new)) if k not in MAY_CHANGE
            and (k in old and k in new or k.startswith(USER_KEYED))
            and old.get(k, ABSENT) != new.get(k, ABSENT)]
    return [f"{k}={_value(old, k)} there, {_value(new, k)} now" for k in keys]


def _value(record: dict[str, Any], key: str) -> str:
    return repr(record[key]) if key in record else ABSENT


def check_resume(plan: ExecutionPlan, run_dir: Path,
                 log: Callable[[str], None] | None = None) -> None:
    """Raise `ResumeRefused` when `plan` may not continue what `run_dir` holds (`log`: where
    a fall-back from a damaged record to plan.json is told)."""
    steps = checkpoint_steps(run_dir)
    if steps and steps[-1] > plan.run.steps:
        raise ResumeRefused(f"run.steps={plan.run.steps}: {run_dir} already holds the checkpoint "
                            f"of step {steps[-1]}; run.steps may only grow on resume")
    old, warning = _recorded(run_dir)
    if old is not None:
        changes = _changes(old, record_of(plan))
        if changes:
            more = f" (and {len(changes) - SHOWN} more)" if len(changes) > SHOWN else ""
            raise ResumeRefused(
                f"{run_dir} was made with another configuration: {'; '.join(changes[:SHOWN])}"
                f"{more}. On resume only {', '.join(MAY_CHANGE[:4])} and settings of speed "
                "may change; use a new hydra.run.dir for a new run")
    if steps:  # the newest step's own record, before plan.json is written
        newest = run_dir / CHECKPOINTS_DIR / str(steps[-1])
        meta = _meta_on_disk(newest)
        if meta is not None:
            check_step_meta(plan, steps[-1], newest, meta)
    if warning and log is not None:  # told only when the resume goes on: a refusal is one line
        log(warning)


ORBAX_META = ("meta", "metadata")
"""Where Orbax's `JsonSave` of a step's `meta` item lies in the step's directory."""


def _meta_on_disk(step_dir: Path) -> dict[str, Any] | None:
    """A step's meta as saved, read without JAX; None when it does not read (a damaged step:
    the restore then falls back, and the trainer checks the step it restores)."""
    try:
        meta = json.loads(step_dir.joinpath(*ORBAX_META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


CHECKPOINT_FORMAT = 1
"""Version of what a checkpoint step holds (its meta keys, how leaves are named); a step of
another format is refused on resume."""


def _kept(plan: ExecutionPlan) -> dict[str, Any]:
    return {k: v for k, v in record_of(plan).items() if k not in MAY_CHANGE}


def config_fingerprint(plan: ExecutionPlan) -> str:
    """16 hex digits of sha256 over the recorded configuration, less what may change on
    resume: the same for every launch that may continue a run."""
    text = json.dumps(_kept(plan), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def step_meta(plan: ExecutionPlan) -> dict[str, Any]:
    """What each checkpoint step's meta says about what wrote it: the format, the
    configuration's fingerprint and the configuration itself (to name what differs)."""
    return {"format": CHECKPOINT_FORMAT, "config_fingerprint": config_fingerprint(plan),
            "config": _kept(plan)}


def check_step_meta(plan: ExecutionPlan, step: int, where: Path, meta: dict[str, Any]) -> None:
    """`ResumeRefused` unless the checkpoint of `step` (in `where`) was written in this
    format, for this step, by a configuration `plan` may continue. Keys only one side knows
    (another version's) do not count, as in `check_resume`."""
    fmt = meta.get("format")
    if fmt != CHECKPOINT_FORMAT:
        raise ResumeRefused(f"{where}: checkpoint format {fmt if fmt is not None else 'absent'}, "
                            f"this LoCoJAX reads format {CHECKPOINT_FORMAT}; resume it with the "
                            "version that wrote it, or use a new hydra.run.dir")
    missing = [k for k in ("step", "config_fingerprint") if k not in meta]
    if missing:
        raise ResumeRefused(f"{where.joinpath(*ORBAX_META)}: lacks {', '.join(missing)} "
                            "(damaged); move the step away to resume from the one before, or "
                            "use a new hydra.run.dir")
    if meta.get("step") != step:
        raise ResumeRefused(f"{where}: its metadata says step {meta.get('step')!r}, its "
                            f"directory step {step}; use a new hydra.run.dir")
    mine, theirs = config_fingerprint(plan), meta.get("config")
    if meta.get("config_fingerprint") == mine:
        return
    changes = _changes(theirs, record_of(plan)) if isinstance(theirs, dict) else [
        "its configuration is not recorded"]
    if changes:
        raise ResumeRefused(f"{where}: written by another configuration (fingerprint "
                            f"{meta.get('config_fingerprint')}, this run's {mine}: "
                            f"{'; '.join(changes[:SHOWN])}); use a new hydra.run.dir")


def record(plan: ExecutionPlan, run_dir: Path) -> None:
    """Write the record on the first launch in `run_dir` (kept as it is afterwards, unless it
    was damaged: `check_resume` then checked `plan` against plan.json)."""
    path = run_dir / RECORD_FILE
    if _read_record(path)[0] is None:
        write_atomic(path, json.dumps(record_of(plan), indent=1) + "\n")

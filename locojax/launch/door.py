"""One door for user errors: every entry point runs through `door`, which turns a mistake in
what the user asked for into one line on stderr and exit 2.

    python -m locojax | locojax.plan | locojax.sample | locojax.calibrate
    python -m locojax.launch.local                                 (the local launcher)
        -> door(main) -> main()
             user errors (PlanError, UserError, DataError, CheckpointError, ResumeRefused,
             RunDirError, NoCheckpointRestores, ConfigKeyError, JobError (joining a multi-host
             job, the hosts' agreement); inside a Ray task error too),
             Hydra's config errors (unknown key with or without `+`, bad type or value,
             missing option: the valid options after a colon when short), the run directory
             Hydra cannot create, a full disk     -> "error: <key or file>...", exit 2
             a run that diverged (NonFinite: the NaN guard, from any host or trainer
             actor)                               -> "error: step N: <metric> is nan; ...",
                                                     exit 1: the run failed, the input was
                                                     fine (2 stays "fix what you asked for")
             SIGTERM / SIGINT, the step saved (Stopped)
                                                  -> "stopped by SIGTERM after step N; ...",
                                                     exit 143 / 130
             SIGTERM / SIGINT outside the RL steps (Interrupted: start-up, compilation, the
             warm-up, the export)                 -> "stopped by SIGTERM during <phase>; ...",
                                                     exit 143 / 130
             Ctrl-C                               -> one line, exit 130
             stdout's reader gone (`| head`)      -> the run goes on, its printing dropped
                                                     (`launch.pipe`)
             anything else (a bug)                -> its traceback, as Python prints it

Hydra is told to re-raise (HYDRA_FULL_ERROR=1) instead of printing its own 6-18-line block;
`task` marks when Hydra has handed over, so an OSError before it is Hydra's run directory.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from compiler import PlanError
from compiler.config import Config
from compiler.errors import ConfigKeyError
from locojax.data import DataError
from locojax.envs.errors import EnvError
from locojax.launch.pipe import quiet_closed_stdout
from locojax.rewards import RewardFnError
from locojax.runtime.errors import (
    JobError,
    NoCheckpointRestores,
    NonFinite,
    ResumeRefused,
    RunDirError,
    SweepFailed,
    SweepInvalid,
    UserError,
)
from locojax.runtime.process.stop import Interrupted, Stopped
from locojax.runtime.rundir.preflight import disk_full

SHORT_OPTIONS = 12
"""Valid options listed after the colon when there are at most this many."""
_state = {"task": False}


def task(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate an entry point's Hydra task function (under `@hydra.main`): its user errors
    exit here, before Hydra would add its "Error executing job" line."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        _state["task"] = True
        return _guarded(lambda: fn(*args, **kwargs))
    return wrapped


def _guarded(fn: Callable[[], Any]) -> Any:
    """`fn()`, with a user error turned into its line and exit 2, Ctrl-C into exit 130."""
    try:
        return fn()
    except Interrupted as stop:
        print(stop, file=sys.stderr, flush=True)
        sys.exit(stop.exit_code)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        sys.exit(130)
    except Stopped as stop:
        print(stop, file=sys.stderr, flush=True)
        sys.exit(stop.exit_code)
    except SweepInvalid as bad:
        _sweep_lines(bad)
    except SweepFailed as failed:
        print(f"error: {failed}", file=sys.stderr, flush=True)
        sys.exit(2)
    except Exception as err:
        line = user_error_line(err)
        if line is not None:
            print(f"error: {line}", file=sys.stderr, flush=True)
            sys.exit(2)
        line = run_failure_line(err)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr, flush=True)
        sys.exit(1)


def _sweep_lines(bad: SweepInvalid) -> None:
    """One line per job of a sweep that does not compile, exit 2; a job's bug raises."""
    lines = []
    for overrides, err in bad.jobs:
        line = user_error_line(err)
        if line is None:
            raise err
        lines.append(f"error: job {overrides or '(no overrides)'}: {line}")
    print("\n".join(lines), file=sys.stderr, flush=True)
    sys.exit(2)


def _user_error_types() -> tuple[type[BaseException], ...]:
    # The model package loads JAX: its CheckpointError is named only if the package is loaded
    # (an error of a package never imported cannot have been raised), so a refusal before any
    # model code, and a plan-only entry point, never load JAX for it. The Ray drivers, which
    # match remote tracebacks by the type's name, load the package with their actors.
    model = sys.modules.get("locojax.model")
    checkpoint = (model.CheckpointError,) if model is not None else ()
    return (PlanError, UserError, DataError, *checkpoint, NoCheckpointRestores,
            ResumeRefused, RunDirError, ConfigKeyError, JobError, RewardFnError, EnvError)


def _first(text: object) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _options(names: list[str]) -> str:
    if len(names) <= SHORT_OPTIONS:
        return ": " + ", ".join(names)
    return f" ({len(names)} of them, e.g. {', '.join(names[:SHORT_OPTIONS])})"


def _schema_keys(full_key: str) -> list[str] | None:
    """Field names of the schema node holding `full_key` (None if it is not a dataclass)."""
    node: Any = Config
    for part in full_key.split(".")[:-1]:
        fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(
            node) else {}
        if part not in fields or fields[part].default_factory is dataclasses.MISSING:
            return None
        node = fields[part].default_factory
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else None


def _bad_override() -> str | None:
    """The first command-line override Hydra's grammar cannot parse."""
    parser = OverridesParser.create()
    for arg in sys.argv[1:]:
        if arg.startswith("-"):
            continue
        try:
            parser.parse_overrides([arg])
        except Exception:
            return arg
    return None


def hydra_line(err: BaseException) -> str | None:
    """One line for a Hydra composition error, or None when `err` is not one."""
    if isinstance(err, MissingConfigException):
        missing = (err.missing_cfg_file or "").strip("/")
        group, _, name = missing.rpartition("/")
        if group:
            return f"{group}={name}: no such option{_options(sorted(err.options or []))}"
        return _first(err)
    if isinstance(err, OverrideParseException):
        bad = _bad_override()
        return f"{bad or 'override'}: cannot parse it ({_first(err)})"
    cause = err.__cause__
    if isinstance(err, HydraException) and isinstance(cause, OmegaConfBaseException):
        key = getattr(cause, "full_key", None) or "config"
        reason = _first(getattr(cause, "msg", cause))
        if "not in" in reason or "not in struct" in reason:
            keys = _schema_keys(key)
            where = key.rpartition(".")[0] or "the config"
            return f"{key}: no such key in {where}" + (_options(keys) if keys else "")
        value = f"={cause.value}" if getattr(cause, "value", None) is not None else ""
        return f"{key}{value}: {reason}"
    if isinstance(err, HydraException | OmegaConfBaseException):
        return _deletion_line(str(err)) or _first(err)
    return None


def _deletion_line(text: str) -> str | None:
    """The line for a `~group` override that deleted what the composition still needs (Hydra
    says only that an interpolation such as `${workload}_${model}` fails)."""
    for arg in sys.argv[1:]:
        key = arg[1:].split("=", 1)[0] if arg.startswith("~") else ""
        if key and "${" + key + "}" in text:
            return (f"{arg}: {key} is required and cannot be deleted; choose one instead "
                    f"({key}=<option>)")
    return None


def _named_in(text: str, types: tuple[type[BaseException], ...]) -> str | None:
    """The message of the last `<module>.<Class>: <message>` line of a remote traceback whose
    class is one of `types` (Ray's actor errors keep only the text of the original)."""
    names = {f"{t.__module__}.{t.__qualname__}" for t in types}
    for line in reversed(text.splitlines()):
        head, sep, message = line.strip().partition(": ")
        if sep and head in names:
            return message
    return None


def _from_ray(err: BaseException, line_of: Callable[[BaseException], str | None],
              types: tuple[type[BaseException], ...]) -> str | None:
    """`line_of` the original error that a Ray task error carries (`.cause`), else the message
    of a `types` line in a Ray error's text (`_named_in`); None when neither holds one."""
    inner = getattr(err, "cause", None)
    if isinstance(inner, BaseException) and inner is not err:
        line = line_of(inner)
        if line is not None:
            return line
    if type(err).__module__.startswith("ray."):
        return _named_in(str(err), types)
    return None


def user_error_line(err: BaseException) -> str | None:
    """The one line for a user error, or None for a bug (which keeps its traceback)."""
    types = _user_error_types()
    # A Ray task error is also an instance of its cause's type: its text is Ray's traceback,
    # so the cause's own line is taken (`_from_ray`).
    if isinstance(err, types) and not type(err).__module__.startswith("ray."):
        return " ".join(str(err).split())
    line = _from_ray(err, user_error_line, types)
    if line is None:
        line = hydra_line(err)
    if line is not None:
        return line
    full = disk_full(err)
    if full is not None:
        return f"{full.filename or 'the run directory'}: no space left on the device; free " \
               "some or choose another hydra.run.dir"
    if isinstance(err, OSError) and not _state["task"]:
        where = "hydra.sweep.dir" if "-m" in sys.argv or "--multirun" in sys.argv \
            else "hydra.run.dir"
        why = "it exists and is not a directory" if isinstance(err, FileExistsError) \
            else err.strerror
        return f"{where}={err.filename}: cannot create the run directory ({why})"
    return None


def run_failure_line(err: BaseException) -> str | None:
    """The one line of a run that failed on its own (the NaN guard), or None."""
    if isinstance(err, NonFinite):
        return str(err)
    return _from_ray(err, run_failure_line, (NonFinite,))


def door(main: Callable[[], Any], hydra_app: bool = True) -> None:
    """Run an entry point's `main` and exit: its code, 2 for a user error, 130 on Ctrl-C.
    `hydra_app=False` for entry points without Hydra (their OSErrors are not a run dir's)."""
    os.environ["HYDRA_FULL_ERROR"] = "1"
    quiet_closed_stdout()  # `| head` ends the printing, not the run
    # jax logs "Unable to initialize backend 'tpu'" at INFO, which Hydra's logging prints.
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    _state["task"] = not hydra_app
    code = _guarded(main)
    sys.exit(code if isinstance(code, int) else 0)

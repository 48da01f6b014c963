"""Every shell command of README.md and docs/*.md runs as written.

A fenced block tagged `bash` (or `sh`, `shell`) holds commands; every other fenced block says
what it is (`text`, `yaml`), so nothing else is mistaken for one. Each command is then:

- run for real when it is cheap: a plan command (`locojax-plan`, `python -m locojax.plan`,
  `-m` sweeps too), a `run.plan_only=true` run, a sample without a checkpoint, `make <target>`
  (as `make -n`): exit 0 and no `error:` line (from a scratch directory, so `multirun/` and
  `outputs/` land there);
- else checked for shell syntax (`bash -n`) and, when it calls locojax, its configuration
  composed (Hydra's compose API) and compiled for a one-device laptop. Training runs (minutes
  each) are checked this way.

A command that needs what a test machine lacks says so: `# needs: <what>` at its end, or
`<!-- needs: <what> -->` on the line before its block. Those needing a `checkpoint` or a
`cluster` are composed but not compiled (composition reads neither); any other need (`a run`,
`network`, `a calibration`) leaves the syntax check alone.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from paths import ROOT

from compiler import DetectedTopology, compile_plan
from compiler.config import MeshKind
from locojax.config.compose import compose_config

pytestmark = pytest.mark.slow

DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
SHELL = {"bash", "sh", "shell"}
OTHER = {"text", "yaml", "json", "python"}
FENCE = re.compile(r"(?:^<!--\s*needs:\s*(?P<needs>[^>]*?)\s*-->\n)?^```(?P<lang>\S*)\n"
                   r"(?P<body>.*?)^```$", re.M | re.S)
NEEDS = re.compile(r"\s#\s*needs:\s*(?P<what>.*)$")
COMPOSED_NEEDS = ("checkpoint", "cluster")
"""Needs that composition does not touch: such commands are still composed."""
ENTRIES = {"locojax": "run", "locojax-plan": "plan", "locojax-sample": "sample",
           "locojax-eval": "eval", "locojax-calibrate": "calibrate", "locojax.__main__": "run",
           "locojax.plan": "plan", "locojax.sample": "sample", "locojax.eval": "eval",
           "locojax.calibrate": "calibrate"}
"""Command (or `python -m` module) -> which entry point."""
PRELUDE = """
locojax() { "$PY" -m locojax "$@"; }
locojax-plan() { "$PY" -m locojax.plan "$@"; }
locojax-sample() { "$PY" -m locojax.sample "$@"; }
locojax-eval() { "$PY" -m locojax.eval "$@"; }
locojax-calibrate() { "$PY" -m locojax.calibrate "$@"; }
python() { "$PY" "$@"; }
"""
"""The four commands of the venv, and `python`, as this test's interpreter runs them."""
SHELL_VARS = {"RUN": "/tmp/locojax-docs-run", "i": "0", "HOME": str(Path.home())}


@dataclass(frozen=True)
class Command:
    where: str
    """file:line"""
    text: str
    """The command as written (continuation lines joined)."""
    needs: str
    """What it needs that a test machine lacks ('' for nothing)."""


def _logical_lines(body: str) -> list[tuple[int, str]]:
    """(line offset, text) of each command: backslash continuations joined, a quoted string
    that spans lines kept whole; comment-only and blank lines dropped."""
    out, buf, start = [], "", 0
    for i, line in enumerate(body.splitlines()):
        if not buf:
            start = i
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        buf = f"{buf}\n{line}" if buf else line
        if buf.endswith("\\"):
            buf = buf[:-1]
            continue
        try:
            shlex.split(buf, comments=True)
        except ValueError:  # an open quote: the string goes on
            continue
        out.append((start, buf))
        buf = ""
    return out


def doc_blocks() -> list[tuple[Path, int, str, str, str]]:
    """(file, line, language, needs of the block, body) of every fenced block."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text[:m.start("body")].count("\n") + 1
            found.append((path, line, m["lang"], m["needs"] or "", m["body"]))
    return found


def doc_commands() -> list[Command]:
    """Every command of every shell block."""
    out = []
    for path, line, lang, block_needs, body in doc_blocks():
        if lang not in SHELL:
            continue
        for offset, text in _logical_lines(body):
            mark = NEEDS.search(text)
            needs = mark["what"].strip() if mark else block_needs
            out.append(Command(f"{path.relative_to(ROOT)}:{line + offset}", text, needs))
    return out


def _words(text: str) -> list[list[str]]:
    """The simple commands of a shell line (split at |, &&, ;), variables filled in; a quoted
    argument that is itself a command line (`--command="... python -m locojax ..."`) too."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    simple, out = [], []
    for token in lexer:
        if set(token) <= set("|&;()<>"):
            out.append(simple)
            simple = []
            continue
        token = re.sub(r"\$\{?(\w+)\}?", lambda m: SHELL_VARS.get(m[1], m[0]), token)
        if " -m locojax" in token:
            out += _words(token)
        else:
            simple.append(token)
    return [w for w in [*out, simple] if w]


def invocations(text: str) -> list[tuple[str, list[str], bool]]:
    """(entry point, its arguments, multirun) of each locojax call in a command line."""
    found = []
    for words in _words(text):
        for i, word in enumerate(words):
            # a command by name, or by its path in a venv (`.venv/bin/locojax`)
            name = Path(word).name if "bin/" in word else word
            if name in ENTRIES and i == 0 or name in ENTRIES and "bin/" in word:
                args = words[i + 1:]
            elif word == "-m" and i + 1 < len(words) and words[i + 1] in ENTRIES:
                name, args = words[i + 1], words[i + 2:]
            else:
                continue
            found.append((ENTRIES[name], [a for a in args if a != "-m"], "-m" in args))
            break
    return found


def _search_path(args: list[str]) -> list[str]:
    """`--config-dir DIR` (Hydra's flag, before the overrides) as the override it amounts to:
    DIR on the search path."""
    out, i = [], 0
    while i < len(args):
        if args[i] == "--config-dir" and i + 1 < len(args):
            out.append(f"hydra.searchpath=[file://{(ROOT / args[i + 1]).resolve()}]")
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def _override_sets(args: list[str], multirun: bool) -> list[list[str]]:
    """The overrides to compose: Hydra's own (`hydra.*`, but for the search path) left out; a
    `-m` sweep's values one at a time (each value once, the others at their first)."""
    kept = [a for a in _search_path(args)
            if not a.lstrip("+~").startswith("hydra.") or a.startswith("hydra.searchpath=")]
    if not multirun:
        return [kept]
    sets = [[a.split(",")[0] if "=" in a else a for a in kept]]
    for j, arg in enumerate(kept):
        key, _, value = arg.partition("=")
        for other in value.split(",")[1:]:
            sets.append([*sets[0][:j], f"{key}={other}", *sets[0][j + 1:]])
    return sets


def _compose_and_compile(entry: str, overrides: list[str], compile_too: bool) -> None:
    config_name = {"run": "config", "plan": "plan", "sample": "sample", "eval": "eval"}[entry]
    cfg = compose_config(overrides, config_name=config_name)
    if compile_too and entry in ("run", "plan"):
        laptop = DetectedTopology(hosts=1, devices_per_host=1)
        compile_plan(cfg, laptop if cfg.mesh.kind == MeshKind.auto else None)


def _runs_for_real(command: Command) -> bool:
    if command.needs:
        return False
    if command.text.startswith("make "):
        return True
    if "| jq" in command.text and shutil.which("jq") is None:
        return False  # jq is the user's; the plan command itself is checked below
    calls = invocations(command.text)
    return bool(calls) and all(
        entry == "plan" or (entry == "run" and "run.plan_only=true" in args)
        or (entry == "sample" and not any(a.startswith("model.checkpoint=") for a in args))
        for entry, args, _ in calls)


def _run(command: Command, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {
        "PY": sys.executable, "PYTHONPATH": str(ROOT)}
    if command.text.startswith("make "):
        return subprocess.run(["make", "-n", *shlex.split(command.text, comments=True)[1:]],
                              cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
    return subprocess.run(["bash", "-o", "pipefail", "-c", PRELUDE + command.text], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def test_every_fenced_block_says_what_it_holds():
    """An untagged block could be a command or not; every block is tagged, and the shell ones
    hold commands (the README once had a block of bare overrides)."""
    for path, line, lang, _, body in doc_blocks():
        assert lang in SHELL | OTHER, f"{path.relative_to(ROOT)}:{line}: block tagged {lang!r}"
        for _, text in _logical_lines(body) if lang in SHELL else ():
            first = shlex.split(text, comments=True)[0]
            key, eq, _ = first.partition("=")
            bare_override = first.startswith("+") or bool(eq) and "." in key
            assert not bare_override, f"{path.relative_to(ROOT)}:{line}: not a command: {text!r}"


def test_the_readme_has_the_two_commands_and_stays_short():
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text
    assert len(text.encode()) < 12_000


COMMANDS = doc_commands()


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_a_documented_command_runs_as_written(command, tmp_path):
    syntax = subprocess.run(["bash", "-n", "-c", command.text], capture_output=True, text=True)
    assert syntax.returncode == 0, f"{command.where}: {syntax.stderr}"
    if _runs_for_real(command):
        out = _run(command, tmp_path)
        said = out.stdout + out.stderr
        assert out.returncode == 0, f"{command.where}: exit {out.returncode}\n{said[-3000:]}"
        errors = [ln for ln in said.splitlines() if ln.startswith("error:")]
        assert not errors, f"{command.where}: {errors}"
        return
    if command.needs and not command.needs.startswith(COMPOSED_NEEDS):
        return  # what it needs is not here: its syntax is all there is to check
    for entry, args, multirun in invocations(command.text):
        if entry == "calibrate":
            continue  # no configuration: its arguments are run directories
        for overrides in _override_sets(args, multirun):
            _compose_and_compile(entry, overrides, compile_too=not command.needs)


def test_the_cluster_recipes_are_marked_and_pass_a_checkpoint_and_data():
    """docs/clusters.md's recipes are checked for syntax and composition only, and each says
    how to start from a checkpoint and where the data is."""
    clusters = [b for b in doc_blocks() if b[0].name == "clusters.md" and b[2] in SHELL]
    assert clusters and all(b[3].startswith("cluster") for b in clusters)
    for _, line, _, _, body in clusters:
        calls = [c for _, t in _logical_lines(body) for c in invocations(t)]
        assert calls, f"clusters.md:{line}: no locojax command"
        for _, args, _ in calls:
            assert any(a.startswith("model.checkpoint=") for a in args), f"clusters.md:{line}"
            assert any(a.startswith("workload.data_dir=") for a in args), f"clusters.md:{line}"

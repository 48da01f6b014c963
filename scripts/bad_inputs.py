"""Runs the bad inputs of issue 18 through every entry point they apply to; prints a table.

    flock /tmp/locojax-heavy.lock .venv/bin/python scripts/bad_inputs.py [--only c01p,k03]
        [--scratch /tmp/locojax-bad-inputs] [--out table.md]

Each case is one command (plan, run, sample, calibrate, the local launcher's hosts, the DA
driver) on a bad config, bad data, a damaged checkpoint, a bad prompt or checkpoint, a signal
or a bad run directory. A case passes when:
- `error`: the exit code is the expected one (2; 130 on SIGINT; the host's on a killed host),
  stderr is exactly one line holding the expected name (key or file), no traceback appears on
  either stream, and nothing was lost from the run directory (the case's own check);
- `ok`: exit 0, the expected words appear (a skipped row named, a fallback reported), no
  traceback, and the case's check holds.
The disk cases mount small tmpfs file systems and set `chattr +i` (root); both are undone.
About 30 minutes on 2 cores; the last line is the pass count.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
QUICK = {"algorithm.sft_warmup_steps": "2", "run.eval_every": "0", "run.steps": "2"}
"""Run settings of every `run` case unless the case sets the key itself (speed only)."""
PROGRESS = re.compile(r"(\[host \d+\] )?step \d+/\d+ \(\d+%\)")
TRACEBACK_MARKS = ("Traceback (most recent call last)", "Check failure stack trace", "*** SIG")


@dataclass
class Case:
    id: str
    what: str
    argv: list[str]
    names: str
    expect: str = "error"
    rc: tuple[int, ...] = (2,)
    stdin: bytes | None = b""
    setup: Callable[[Path], None] | None = None
    check: Callable[[Path], str | None] | None = None
    """Returns what was lost or wrong (None: fine)."""
    runner: Callable[[Case, Path], tuple[int, str, str]] | None = None
    cwd: Path | None = None
    shell: bool = False
    extra: dict = field(default_factory=dict)


def run_argv(run_dir: str, *overrides: str, experiment: str = "arith_co") -> list[str]:
    keys = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    quick = [f"{k}={v}" for k, v in QUICK.items() if k not in keys]
    return ["-m", "locojax", f"+experiment={experiment}", *quick, *overrides,
            f"hydra.run.dir={run_dir}"]


def plan_argv(*overrides: str) -> list[str]:
    return ["-m", "locojax.plan", "+experiment=arith_co", *overrides]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def _sub(argv: list[str], scratch: Path) -> list[str]:
    return [a.replace("{s}", str(scratch)) for a in argv]


def execute(case: Case, scratch: Path) -> tuple[int, str, str]:
    argv = _sub(case.argv, scratch)
    cmd = " ".join([PY, *argv]) if case.shell else [PY, *argv]
    out = subprocess.run(cmd, input=case.stdin, capture_output=True, timeout=900, env=_env(),
                         cwd=case.cwd or ROOT, shell=case.shell,
                         stdin=None if case.stdin is not None else subprocess.DEVNULL)
    return out.returncode, out.stdout.decode(errors="replace"), out.stderr.decode(errors="replace")


# ---- fixtures -------------------------------------------------------------------------------

def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "absent"


def pristine(scratch: Path) -> Path:
    """A finished 6-step run (checkpoints 4 and 6 kept), made once."""
    base = scratch / "ck_pristine"
    meta = base / "checkpoints" / "6" / "meta" / "metadata"
    # Rebuilt when missing, or made before checkpoints carried their format (issue 28).
    # Rebuilt too when its export predates the export's marker (issue 41).
    if not (base / "hf" / "locojax_export.json").exists() or '"format"' not in (
            meta.read_text() if meta.is_file() else ""):
        shutil.rmtree(base, ignore_errors=True)
        out = subprocess.run([PY, *run_argv(str(base), "run.steps=6", "run.checkpoint_every=2")],
                             capture_output=True, env=_env(), cwd=ROOT, timeout=900)
        assert out.returncode == 0, out.stderr.decode()[-2000:]
    return base


def copy_run(case_id: str, damage: Callable[[Path], None] | None = None):
    def setup(scratch: Path) -> None:
        dst = scratch / f"ck_{case_id}"
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(pristine(scratch), dst)
        (dst / "plan.sha").write_text(_sha(dst / "plan.json"))
        if damage is not None:
            damage(dst)
    return setup


def plan_kept(case_id: str):
    def check(scratch: Path) -> str | None:
        d = scratch / f"ck_{case_id}"
        if _sha(d / "plan.json") != (d / "plan.sha").read_text():
            return "plan.json overwritten"
        if sorted(p.name for p in (d / "checkpoints").iterdir()) != ["4", "6"]:
            return "checkpoints changed"
        return None
    return check


def _largest(step_dir: Path) -> Path:
    return max((p for p in (step_dir / "params").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)


def truncate(d: Path) -> None:
    path = _largest(d / "checkpoints" / "6")
    os.truncate(path, path.stat().st_size // 3)


def bit_rot(d: Path) -> None:
    path = _largest(d / "checkpoints" / "6")
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    n = min(4096, len(data) - mid)
    data[mid:mid + n] = os.urandom(n)
    path.write_bytes(bytes(data))


def rm(rel: str) -> Callable[[Path], None]:
    return lambda d: (shutil.rmtree if (d / rel).is_dir() else os.remove)(d / rel)


def both_truncated(d: Path) -> None:
    for step in ("4", "6"):
        path = _largest(d / "checkpoints" / step)
        os.truncate(path, path.stat().st_size // 3)
    (d / "tree.sha").write_text(_tree_sha(d / "checkpoints"))


def _tree_sha(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(d)).encode() + p.read_bytes())
    return h.hexdigest()


def resumed_to_end(case_id: str):
    def check(scratch: Path) -> str | None:
        d = scratch / f"ck_{case_id}"
        rows = (d / "metrics.jsonl").read_text().splitlines()
        ok = (d / "hf" / "model.safetensors").exists() and len(rows) == 6
        return None if ok else f"metrics rows {len(rows)}, hf export {(d / 'hf').exists()}"
    return check


def nothing_touched(case_id: str):
    def check(scratch: Path) -> str | None:
        d = scratch / f"ck_{case_id}"
        return None if _tree_sha(d / "checkpoints") == (d / "tree.sha").read_text() \
            else "checkpoints changed"
    return check


def _without_export(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    def both(d: Path) -> None:
        damage(d)
        shutil.rmtree(d / "hf", ignore_errors=True)
    return both


def hf_variant(name: str, change: Callable[[Path], None]):
    def setup(scratch: Path) -> None:
        dst = scratch / "sck" / name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(pristine(scratch) / "hf", dst)
        change(dst)
    return setup


def _tensors(change):
    def edit(d: Path) -> None:
        from safetensors.numpy import load_file, save_file
        t = load_file(d / "model.safetensors")
        change(t)
        save_file(t, d / "model.safetensors")
    return edit


def _config(change):
    def edit(d: Path) -> None:
        cfg = json.loads((d / "config.json").read_text())
        change(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    return edit


def _nan(t):
    import numpy as np
    for k in t:
        t[k] = np.full_like(t[k], np.nan)


def data_variant(name: str, change: Callable[[Path], None]):
    def setup(scratch: Path) -> None:
        dst = scratch / "data" / name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(ROOT.parent / "shared" / "data" / "gsm8k", dst)
        change(dst)
    return setup


def _non_utf8(d: Path) -> None:
    lines = (d / "train.jsonl").read_bytes().split(b"\n")
    lines[1] = lines[1][:20] + b"\xff\xfe\x80" + lines[1][20:]
    (d / "train.jsonl").write_bytes(b"\n".join(lines))


def _dir_split(d: Path) -> None:
    (d / "train.jsonl").unlink()
    (d / "train.jsonl").mkdir()


def has_checkpoint(run: str):
    def check(scratch: Path) -> str | None:
        d = scratch / "runs" / run / "checkpoints"
        return None if d.is_dir() and any(p.name.isdigit() for p in d.iterdir()) \
            else "no checkpoint written"
    return check


# ---- signal and disk runners ----------------------------------------------------------------

def _popen(case: Case, scratch: Path) -> subprocess.Popen:
    # SIGINT at its default, as in a terminal (a background job inherits it ignored).
    return subprocess.Popen([PY, *_sub(case.argv, scratch)], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_rows(path: Path, n: int, proc: subprocess.Popen, limit: float = 600) -> None:
    deadline = time.time() + limit
    while not (path.exists() and len(path.read_text().splitlines()) >= n):
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"run ended or stalled before {n} rows of {path}")
        time.sleep(0.2)


def kill_host(host: int):
    def runner(case: Case, scratch: Path) -> tuple[int, str, str]:
        import psutil
        proc = _popen(case, scratch)
        _wait_rows(scratch / "runs" / case.id / "metrics.jsonl", 3, proc)
        # The launcher gives each host JAX_PROCESS_ID; a joined host is a supervisor and its
        # forked child (locojax.launch.fatal), both with it: kill all of that host at once.
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.environ().get("JAX_PROCESS_ID") == str(host):
                    child.kill()
        out, err = proc.communicate(timeout=300)
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    return runner


def interrupt(case: Case, scratch: Path) -> tuple[int, str, str]:
    proc = _popen(case, scratch)
    _wait_rows(scratch / "runs" / case.id / "metrics.jsonl", 3, proc)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def _tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["umount", str(path)], capture_output=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)


def on_tmpfs(size: str):
    def runner(case: Case, scratch: Path) -> tuple[int, str, str]:
        mnt = scratch / f"full_{case.id}"
        _tmpfs(mnt, size)
        try:
            return execute(case, scratch)
        finally:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    return runner


def immutable(case: Case, scratch: Path) -> tuple[int, str, str]:
    d = scratch / "immut"
    if d.exists():
        subprocess.run(["chattr", "-i", str(d)], capture_output=True)
        shutil.rmtree(d)
    d.mkdir()
    subprocess.run(["chattr", "+i", str(d)], check=True)
    try:
        return execute(case, scratch)
    finally:
        subprocess.run(["chattr", "-i", str(d)], capture_output=True)


def _afile(scratch: Path) -> None:
    (scratch / "afile").write_text("not a directory\n")


# ---- the cases ------------------------------------------------------------------------------

CONFIG = [  # id, override(s), the name the line must hold; plan and run each
    ("c01", ["+foo=1"], "foo"), ("c02", ["foo=1"], "foo"), ("c03", ["run.stepz=5"], "stepz"),
    ("c04", ["run.steps=abc"], "run.steps"), ("c05", ["run.steps=-1"], "run.steps"),
    ("c06", ["run.steps=0", "algorithm.sft_warmup_steps=0"], "run.steps"), ("c07", ["run.steps=1.5"], "run.steps"),
    ("c09", ["workload.group_size=1"], "workload.group_size"),
    ("c11", ["sampling.temperature=-1"], "sampling.temperature"),
    ("c12", ["algorithm.learning_rate=-1"], "algorithm.learning_rate"),
    ("c13", ["algorithm.lr=-1"], "lr"),
    ("c15", ["placement.rollout_fraction=1.5"], "placement.rollout_fraction"),
    ("c19", ["model=nope"], "model"), ("c20", ["workload=nope"], "workload"),
    ("c23", ["sampling.top_p=2"], "sampling.top_p"), ("c24", ["sampling.top_k=-5"], "top_k"),
    ("c25", ["model.hidden=0"], "model.hidden"),
    ("c27", ["algorithm.clip_eps=-0.1"], "algorithm.clip_eps"),
    ("c28", ["run.checkpoint_every=-1"], "run.checkpoint_every"),
    ("c29", ["run.seed=abc"], "run.seed"),
    ("c31", ["algorithm.loss_aggregation=bogus"], "loss_aggregation"),
    ("c32", ["model.dtype=float7"], "model.dtype"), ("c33", ["run.plan_only=maybe"], "plan_only"),
    ("c36", ["controller.heartbeat_timeout_s=0"], "controller.heartbeat_timeout_s"),
    ("c37", ["controller.coordinator_port=99999"], "controller.coordinator_port"),
    ("c39", ["model.vocab=5"], "model.vocab"),
    ("c41", ["sampling.temperature=nan"], "sampling.temperature"),
    ("c42", ["algorithm.learning_rate=inf"], "algorithm.learning_rate"),
    ("c44", ["model.tokenizer=bogus"], "model.tokenizer"),
    ("c45", ["run.eval_every=-5"], "run.eval_every"),
    ("c46", ["model.num_heads=0"], "model.num_heads"),
    ("c48", ["workload.arith.min_operand=9", "workload.arith.max_operand=0"],
     "workload.arith.max_operand"),
    ("c49", ["workload.arith.ops=%"], "workload.arith.ops"),
    ("c50", ["algorithm.sft_warmup_steps=-1"], "algorithm.sft_warmup_steps"),
]
SAMPLE = ["-m", "locojax.sample", "model.checkpoint={s}/ck_pristine/hf", "model.tokenizer=char",
          "sampling.temperature=0", "sampling.max_new_tokens=8"]
SAMPLING_KEYS = ("c01", "c11", "c23", "c24", "c41")


def _signal_disk_cases() -> list[Case]:
    """Signals to runs, and run directories on odd disks."""
    return [
        Case("m1", "kill host 1 of 2", run_argv("{s}/runs/m1", "mesh=cpu", "mesh.hosts=2",
                                                "run.steps=200", "run.checkpoint_every=50",
                                                "controller.heartbeat_timeout_s=5"),
             "host 1", rc=(137,), runner=kill_host(1)),
        Case("m2", "kill host 0 of 2", run_argv("{s}/runs/m2", "mesh=cpu", "mesh.hosts=2",
                                                "run.steps=200", "run.checkpoint_every=50",
                                                "controller.heartbeat_timeout_s=5"),
             "host 0", rc=(137,), runner=kill_host(0)),
        Case("m3", "SIGINT to the launcher of 2 hosts",
             run_argv("{s}/runs/m3", "mesh=cpu", "mesh.hosts=2", "run.steps=200",
                      "run.checkpoint_every=50"), "SIGINT", rc=(130,), runner=interrupt,
             check=has_checkpoint("m3")),
        Case("m4", "SIGINT to a single-process run",
             run_argv("{s}/runs/m4", "run.steps=200", "run.checkpoint_every=50"), "SIGINT",
             rc=(130,), runner=interrupt, check=has_checkpoint("m4")),
        # disk
        Case("k03", "hydra.run.dir under /proc", run_argv("/proc/fuzzrun"), "/proc/fuzzrun"),
        Case("k04", "hydra.run.dir is a file", run_argv("{s}/afile"), "afile", setup=_afile),
        Case("k05", "hydra.run.dir below a file", run_argv("{s}/afile/sub"), "afile",
             setup=_afile),
        Case("k06", "hydra.run.dir=/dev/null", run_argv("/dev/null"), "/dev/null"),
        Case("k07", "hydra.run.dir inside a chattr +i directory", run_argv("{s}/immut/run"),
             "immut", runner=immutable),
        Case("k08", "plan -m from a chattr +i working directory",
             ["-m", "locojax.plan", "-m", "+experiment=arith_co", "mesh=cpu", "mesh.hosts=1,2"],
             "multirun", cwd=None, runner=None, extra={"immutable_cwd": True}),
        Case("k09", "run dir on a 3 MB tmpfs", run_argv("{s}/full_k09/run", "run.steps=4",
                                                        "run.checkpoint_every=2"),
             "full_k09", runner=on_tmpfs("3m")),
        Case("k10", "run dir on a 7 MB tmpfs", run_argv("{s}/full_k10/run", "run.steps=4",
                                                        "run.checkpoint_every=2"),
             "full_k10", runner=on_tmpfs("7m")),
    ]


def _sample_signal_disk_cases() -> list[Case]:
    """The sampling CLI's inputs, then `_signal_disk_cases`."""
    hf = "{s}/sck"
    prompt100k = ("3+5=" * 25_000).encode()
    words = (" ".join(["the", "quick", "brown", "fox", "jumps"]) + " ") * 3400
    return [
        Case("s02", "sample, stdin closed", [*SAMPLE, "<&-"], "standard input is closed",
             shell=True, setup=lambda s: pristine(s) and None),
        *[Case(cid, what, [*SAMPLE[:2], f"model.checkpoint={hf}/{cid}", *SAMPLE[3:],
                           "prompt='3+5='"], name, setup=hf_variant(cid, change))
          for cid, what, change, name in [
              ("s05", "layer-0 q_proj cut to half its columns",
               _tensors(lambda t: t.update({"model.layers.0.self_attn.q_proj.weight":
                                            t["model.layers.0.self_attn.q_proj.weight"][:, :64]
                                            .copy()})), "model.layers.0.self_attn.q_proj"),
              ("s06", "config.json hidden_size 64, tensors 128",
               _config(lambda c: c.update(hidden_size=64)), "config.json"),
              ("s07", "model.safetensors truncated",
               lambda d: os.truncate(d / "model.safetensors", 500_000), "model.safetensors"),
              ("s08", "config.json not JSON",
               lambda d: (d / "config.json").write_text("{oops"), "config.json"),
              ("s09", "layer-0 down_proj removed",
               _tensors(lambda t: t.pop("model.layers.0.mlp.down_proj.weight")),
               "model.layers.0.mlp.down_proj.weight is missing"),
              ("s10", "an extra layers.7 gate_proj",
               _tensors(lambda t: t.update({"model.layers.7.mlp.gate_proj.weight":
                                            t["model.layers.0.mlp.gate_proj.weight"]})),
               "model.layers.7.mlp.gate_proj.weight"),
              ("s12", "every weight NaN", _tensors(_nan), "non-finite")]],
        Case("s14", "100,000-character prompt argument (char tokenizer)",
             [*SAMPLE, f"prompt='{prompt100k.decode()}'"], "max_position",
             setup=lambda s: pristine(s) and None),
        Case("s15", "the same prompt on stdin", SAMPLE, "max_position", stdin=prompt100k,
             setup=lambda s: pristine(s) and None),
        # ~17k qwen tokens: within model=tiny's max_position=40960, so the cap is lowered.
        Case("s16", "100,000 characters of words, qwen tokenizer",
             ["-m", "locojax.sample", "model=tiny", "model.max_position=4096"], "max_position",
             stdin=words.encode()),
        Case("s21", "invalid UTF-8 on stdin", ["-m", "locojax.sample", "model=tiny"],
             "not UTF-8", stdin=b"3+5=\xff\xfe\x80"),
        Case("s23", "output=bogus", [*SAMPLE, "prompt='3+5='", "output=bogus"], "output",
             setup=lambda s: pristine(s) and None),
    ] + _signal_disk_cases()


def _checkpoint_cases() -> list[Case]:
    """A finished run's checkpoints damaged, and resumes into a changed config."""
    out = []
    ck = [("a1", "params data file of step 6 truncated", truncate),
          ("a4", "params/ of step 6 deleted", rm("checkpoints/6/params")),
          ("a5", "4 KiB of step 6's params overwritten (bit rot)", bit_rot),
          ("a6", "meta of step 6 deleted", rm("checkpoints/6/meta"))]
    for cid, what, damage in ck:
        # Without hf/: a run stopped after its last save, which a re-run resumes (a finished
        # run, export whole, says 'already complete' before any checkpoint is read).
        out.append(Case(cid, what, run_argv(f"{{s}}/ck_{cid}", "run.steps=6",
                                            "run.checkpoint_every=2"),
                        "resumed from the checkpoint of step 4", expect="ok", rc=(0,),
                        setup=copy_run(cid, _without_export(damage)),
                        check=resumed_to_end(cid)))
    out.append(Case("a7", "steps 4 and 6 both truncated",
                    run_argv("{s}/ck_a7", "run.steps=6", "run.checkpoint_every=2"),
                    "no checkpoint restores", setup=copy_run("a7", _without_export(both_truncated)),
                    check=nothing_touched("a7")))
    for cid, what, overrides, name in [
            ("b1", "resume with model.hidden=64", ["model.hidden=64"], "model.hidden"),
            ("b2", "resume with 3 layers, 8 steps", ["model.num_layers=3", "run.steps=8"],
             "model.num_layers"),
            ("b3", "resume with ffn 256, 8 steps", ["model.ffn=256", "run.steps=8"], "model.ffn"),
            ("b4", "resume with seed 7, lr 0.01, 8 steps",
             ["run.seed=7", "algorithm.learning_rate=0.01", "run.steps=8"], "run.seed"),
            ("e1", "finished 6-step dir re-run with run.steps=4", ["run.steps=4"], "run.steps")]:
        overrides = [*overrides, "run.checkpoint_every=2"]
        if "run.steps=8" not in overrides and cid != "e1":
            overrides.append("run.steps=6")
        out.append(Case(cid, what, run_argv(f"{{s}}/ck_{cid}", *overrides), name,
                        setup=copy_run(cid), check=plan_kept(cid)))
    return out


def cases() -> list[Case]:
    out = []
    for cid, overrides, name in CONFIG:
        out.append(Case(f"{cid}p", f"plan {' '.join(overrides)}", plan_argv(*overrides), name))
        out.append(Case(f"{cid}r", f"run {' '.join(overrides)}",
                        run_argv(f"{{s}}/runs/{cid}r", *overrides), name))
        if cid in SAMPLING_KEYS:
            out.append(Case(f"{cid}s", f"sample {' '.join(overrides)}",
                            [*SAMPLE, "prompt='3+5='", *overrides], name,
                            setup=lambda s: pristine(s) and None))
    out += [
        Case("c34p", "plan +experiment=nope", ["-m", "locojax.plan", "+experiment=nope"],
             "experiment"),
        Case("c34r", "run +experiment=nope", ["-m", "locojax", "+experiment=nope"], "experiment"),
        Case("c21r", "run model.checkpoint=/nonexistent",
             run_argv("{s}/runs/c21r", "model.checkpoint=/nonexistent"), "model.checkpoint"),
        Case("c51r", "run run.checkpoint_every=0 (saves at the end)",
             run_argv("{s}/runs/c51r", "run.checkpoint_every=0"), "", expect="ok", rc=(0,),
             check=has_checkpoint("c51r")),
        Case("h01", "2 launcher hosts, model.checkpoint=/nonexistent",
             run_argv("{s}/runs/h01", "mesh=cpu", "mesh.hosts=2",
                      "model.checkpoint=/nonexistent"), "model.checkpoint"),
        Case("da01", "DA driver, model.checkpoint=/nonexistent",
             run_argv("{s}/runs/da01", "mesh=cpu", "mesh.hosts=3",
                      "model.checkpoint=/nonexistent", experiment="arith_da"),
             "model.checkpoint"),
        Case("da02", "DA driver, workload.group_size=1",
             run_argv("{s}/runs/da02", "mesh=cpu", "mesh.hosts=3", "workload.group_size=1",
                      experiment="arith_da"), "workload.group_size"),
        Case("cal1", "calibrate a directory that does not exist",
             ["-m", "locojax.calibrate", "{s}/nonexistent"], "nonexistent"),
        Case("cal2", "calibrate a run dir without metrics.jsonl",
             ["-m", "locojax.calibrate", "{s}/cal2"], "metrics.jsonl",
             setup=lambda s: (s / "cal2").mkdir(exist_ok=True) or shutil.copy(
                 ROOT / "tests/fixtures/calib_run/plan.json", s / "cal2" / "plan.json")),
        # data
        Case("d04", "gsm8k train row 2 not UTF-8 (skipped, named)",
             run_argv("{s}/runs/d04", "model=tiny", "workload.data_dir={s}/data/d04",
                      "run.steps=1", experiment="gsm8k_co"),
             "not UTF-8", expect="ok", rc=(0,), setup=data_variant("d04", _non_utf8)),
        Case("d10", "gsm8k train.jsonl is a directory",
             run_argv("{s}/runs/d10", "model=tiny", "workload.data_dir={s}/data/d10",
                      "run.steps=1", experiment="gsm8k_co"),
             "train.jsonl is not a file", setup=data_variant("d10", _dir_split)),
    ]
    out += _checkpoint_cases()
    out += _sample_signal_disk_cases()
    out += issue28_cases()  # r28a
    return out


# ---- issue 28 items 1-3 (r28a): the run directory owned and checked, the record trusted
# ---- only when valid, no signal dropped at the end of a run ---------------------------------

def _foreign_dir(case_id: str):
    def setup(scratch: Path) -> None:
        d = scratch / "runs" / case_id
        d.mkdir(parents=True, exist_ok=True)
        (d / "passwd").write_text("root:x:0:0\n")
        (d / "hosts").write_text("127.0.0.1 localhost\n")
    return setup


def _foreign_kept(case_id: str):
    def check(scratch: Path) -> str | None:
        d = scratch / "runs" / case_id
        if (d / "passwd").read_text() != "root:x:0:0\n" or (d / "plan.json").exists():
            return "the foreign directory was written into"
        return None
    return check


def _second_run(case: Case, scratch: Path) -> tuple[int, str, str]:
    """The same command twice: the second starts while the first holds the directory."""
    first = _popen(case, scratch)
    deadline = time.time() + 600
    while not (scratch / "runs" / case.id / "plan.json").exists():
        if first.poll() is not None or time.time() > deadline:
            raise RuntimeError("the first run ended before writing plan.json")
        time.sleep(0.05)
    try:
        return execute(case, scratch)
    finally:
        os.kill(first.pid, signal.SIGTERM)
        first.communicate(timeout=300)


def _replace_dir(rel: str, with_loop: bool = False) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        (shutil.rmtree if (d / rel).is_dir() else os.remove)(d / rel)
        (d / rel).symlink_to(d / rel) if with_loop else (d / rel).mkdir()
    return damage


def _plan_same(case_id: str):
    def check(scratch: Path) -> str | None:
        d = scratch / f"ck_{case_id}"
        plan = d / "plan.json"
        if plan.is_file() and _sha(plan) != (d / "plan.sha").read_text():
            return "plan.json overwritten"
        return "a .partial left" if list(d.glob(".*.partial")) else None
    return check


def _write(rel: str, text: str) -> Callable[[Path], None]:
    return lambda d: (d / rel).write_text(text)


def _meta_999(d: Path) -> None:
    meta = d / "checkpoints" / "6" / "meta" / "metadata"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "step": 999, "seed": 5,
                                "format": 99}))


STOPPER = '''
import os, signal
from pathlib import Path

def stop_in_eval(prompts, completions, **columns):
    run = Path(os.environ["STOP_RUN_DIR"])
    sent = run.with_name(run.name + "-signal-sent")
    metrics = run / "metrics.jsonl"
    rows = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    # the last step's evaluation: after step 1's row, a call without the training rows'
    # completion_ids; its checkpoint is saved after its row (07484d7), so none exists yet
    if rows == 1 and "completion_ids" not in columns and not sent.exists():
        sent.write_text("sent")
        os.kill(os.getppid(), signal.SIGTERM)
    return [0.0] * len(completions)
'''
TAIL = ["workload=custom", f"+workload.data_files.train={ROOT / 'examples/reverse/train.jsonl'}",
        "algorithm.sft_warmup_steps=0", "run.eval_every=2", "run.checkpoint_every=0",
        "workload.prompts_per_step=8", "workload.group_size=4", "workload.eval_prompts=4"]


def _tail_signal(during_eval: bool):
    """SIGTERM during the last step's evaluation (sent by a reward function once step 2's
    checkpoint exists), or as soon as the export's directory appears."""
    def runner(case: Case, scratch: Path) -> tuple[int, str, str]:
        run = scratch / "runs" / case.id
        sent = run.with_name(run.name + "-signal-sent")
        shutil.rmtree(run, ignore_errors=True)
        sent.unlink(missing_ok=True)
        run.parent.mkdir(parents=True, exist_ok=True)
        (scratch / "stopper.py").write_text(STOPPER)
        if not during_eval:
            sent.write_text("not by the reward function")
        argv = [PY, *_sub(case.argv, scratch)]
        proc = subprocess.Popen(argv, cwd=ROOT, env={**_env(), "STOP_RUN_DIR": str(run)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 600
        # the export's first write: its staging directory (hf/ appears once it is whole)
        while not during_eval and not any(run.glob(".hf.partial-*")) \
                and not (run / "hf").exists():
            if proc.poll() is not None or time.time() > deadline:
                break
            time.sleep(0.01)
        if not during_eval and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=600)
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    return runner


def _export(whole: bool, case_id: str):
    def check(scratch: Path) -> str | None:
        has = (scratch / "runs" / case_id / "hf" / "config.json").is_file()
        return None if has == whole else f"HF export {'missing' if whole else 'written'}"
    return check


def issue28_cases() -> list[Case]:
    """Issue 28, items 1-3: each a run on a damaged or busy run directory, a damaged record
    or checkpoint, or a signal at the end of a run."""
    tail = [*TAIL, "+workload.reward_fns.stop={s}/stopper.py:stop_in_eval"]
    return [
        Case("r01", "hydra.run.dir holds passwd and hosts (not a run dir)",
             run_argv("{s}/runs/r01"), "not a LoCoJAX run directory",
             setup=_foreign_dir("r01"), check=_foreign_kept("r01")),
        Case("r02", "the same with run.reuse_dir=true", run_argv("{s}/runs/r02",
                                                                 "run.reuse_dir=true"),
             "final policy", expect="ok", rc=(0,), setup=_foreign_dir("r02")),
        Case("r03", "the same command twice, the second while the first runs",
             run_argv("{s}/runs/r03", "run.steps=200"), "another run is using it (pid",
             runner=_second_run),
        Case("r04", "metrics.jsonl is a directory", run_argv("{s}/ck_r04", "run.steps=6"),
             "metrics.jsonl: a directory", setup=copy_run("r04", _replace_dir("metrics.jsonl")),
             check=_plan_same("r04")),
        Case("r05", "checkpoints is a symlink to itself", run_argv("{s}/ck_r05", "run.steps=6"),
             "checkpoints: a symbolic link that loops",
             setup=copy_run("r05", _replace_dir("checkpoints", with_loop=True)),
             check=_plan_same("r05")),
        Case("r06", "plan.json is a directory", run_argv("{s}/ck_r06", "run.steps=6"),
             "plan.json: a directory", setup=copy_run("r06", _replace_dir("plan.json")),
             check=_plan_same("r06")),
        Case("r07", "a step directory named ² (not a step)", run_argv("{s}/ck_r07",
                                                                     "run.steps=6"),
             "already", expect="ok", rc=(0,),
             setup=copy_run("r07", lambda d: (d / "checkpoints" / "²").mkdir())),
        Case("r08", "resolved_config.json null; resume with seed 7, lr 0.01",
             run_argv("{s}/ck_r08", "run.steps=8", "run.seed=7",
                      "algorithm.learning_rate=0.01"), "run.seed=0 there, 7 now",
             setup=copy_run("r08", _write("resolved_config.json", "null")),
             check=plan_kept("r08")),
        Case("r09", "resolved_config.json is 42; resume with seed 7",
             run_argv("{s}/ck_r09", "run.steps=8", "run.seed=7"), "run.seed=0 there, 7 now",
             setup=copy_run("r09", _write("resolved_config.json", "42")),
             check=plan_kept("r09")),
        Case("r10", "resolved_config.json null and plan.json not JSON",
             run_argv("{s}/ck_r10", "run.steps=8"), "what configuration made it is unknown",
             setup=copy_run("r10", lambda d: (_write("resolved_config.json", "null")(d),
                                              _write("plan.json", "{broken")(d)))),
        Case("r11", "step 6's meta says step 999, seed 5, format 99",
             run_argv("{s}/ck_r11", "run.steps=8", "run.checkpoint_every=2"),
             "checkpoint format 99", setup=copy_run("r11", _meta_999), check=plan_kept("r11")),
        Case("r12", "SIGTERM during the last step's evaluation",
             run_argv("{s}/runs/r12", *tail), "stopped by SIGTERM after step 2; checkpoint "
                                                "saved", rc=(143,),
             runner=_tail_signal(during_eval=True), check=_export(False, "r12")),
        Case("r13", "SIGTERM during the export", run_argv("{s}/runs/r13", *tail),
             "stopped by SIGTERM", rc=(143,), runner=_tail_signal(during_eval=False),
             check=_export(True, "r13")),
    ]

# ---- end of issue 28 items 1-3 (r28a) -----------------------------------------------------


# ---- issue 28 items 4-6 (r28b): HF config fields, sweeps, Ray ------------------------------

def _tokenizer_not_json(d: Path) -> None:
    (d / "tokenizer.json").write_text("{oops")


def _with_env(**extra: str):
    def runner(case: Case, scratch: Path) -> tuple[int, str, str]:
        out = subprocess.run([PY, *_sub(case.argv, scratch)], capture_output=True, timeout=900,
                             env={**_env(), **extra}, cwd=ROOT, stdin=subprocess.DEVNULL)
        return out.returncode, out.stdout.decode(errors="replace"), out.stderr.decode(
            errors="replace")
    return runner


def _no_job_ran(sweep: str):
    def check(scratch: Path) -> str | None:
        d = scratch / "runs" / sweep
        return "a job ran" if d.exists() and any(d.rglob("metrics.jsonl")) else None
    return check


def _listening_outside_loopback(pid: int) -> list[str]:
    """`address:port name` of each TCP socket the process tree listens on outside loopback."""
    import ipaddress

    import psutil
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    names = {p.pid: p.name() for p in tree}
    out = []
    for c in psutil.net_connections("tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid in names:
            ip = ipaddress.ip_address(c.laddr.ip)
            if not (getattr(ip, "ipv4_mapped", None) or ip).is_loopback:
                out.append(f"{c.laddr.ip}:{c.laddr.port} {names[c.pid]}")
    return out


def ray_sockets(case: Case, scratch: Path) -> tuple[int, str, str]:
    """A DA run: while it trains, no process of it listens outside loopback; then SIGINT."""
    proc = _popen(case, scratch)
    _wait_rows(scratch / "runs" / case.id / "metrics.jsonl", 2, proc)
    outside = _listening_outside_loopback(proc.pid)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    (scratch / "runs" / case.id / "outside.txt").write_text("\n".join(outside))
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def _nothing_outside(case_id: str):
    def check(scratch: Path) -> str | None:
        d = scratch / "runs" / case_id
        outside = (d / "outside.txt").read_text()
        writable = [str(p) for p in [d, *d.rglob("*")]
                    if p.is_dir() and not p.is_symlink() and p.stat().st_mode & 0o002]
        return "; ".join(filter(None, [outside and f"listening: {outside}",
                                       writable and f"world-writable: {writable}"])) or None
    return check


def cases_r28b() -> list[Case]:
    def sample(cid: str, tokenizer: str = "char") -> list[str]:
        return ["-m", "locojax.sample", f"model.checkpoint={{s}}/sck/{cid}",
                f"model.tokenizer={tokenizer}", "sampling.temperature=0",
                "sampling.max_new_tokens=8", "prompt='3+5='"]

    out = [Case(cid, what, sample(cid), name, setup=hf_variant(cid, change))
           for cid, what, change, name in [
               ("hf2", "config.json hidden_act gelu",
                _config(lambda c: c.update(hidden_act="gelu")), "hidden_act='gelu'"),
               ("hf3", "config.json use_sliding_window with a 16-token window",
                _config(lambda c: c.update(use_sliding_window=True, sliding_window=16,
                                           max_window_layers=0)), "use_sliding_window"),
               ("hf4", "config.json vocab_size \"32\" (a string)",
                _config(lambda c: c.update(vocab_size="32")), "vocab_size='32'"),
               ("hf5", "config.json num_hidden_layers 2.0",
                _config(lambda c: c.update(num_hidden_layers=2.0)), "num_hidden_layers=2.0"),
               ("hf6", "config.json num_experts 8 (MoE)",
                _config(lambda c: c.update(num_experts=8)), "num_experts=8")]]
    # yarn is computed since issue 39: the older spelling without the original context
    # samples (transformers then reads max_position_embeddings as the original)
    out.append(Case("hf1", "config.json rope_scaling {type: yarn}, no original context "
                    "(older spelling)", sample("hf1"), "", expect="ok", rc=(0,),
                    setup=hf_variant("hf1", _config(lambda c: c.update(
                        rope_scaling={"type": "yarn", "factor": 4.0})))))
    out += [
        Case("hf7", "tokenizer.json not JSON (model.tokenizer=checkpoint)",
             sample("hf7", "checkpoint"), "tokenizer.json",
             setup=hf_variant("hf7", _tokenizer_not_json)),
        Case("sw1", "plan sweep run.steps=3,-1", ["-m", "locojax.plan", "-m",
                                                  "+experiment=arith_co", "run.steps=3,-1",
                                                  "hydra.sweep.dir={s}/runs/sw1"],
             "run.steps=-1", check=_no_job_ran("sw1")),
        Case("sw2", "run sweep whose last job is invalid (run.steps=2,-1)",
             ["-m", "locojax", "-m", "+experiment=arith_co", "algorithm.sft_warmup_steps=0",
              "run.eval_every=0", "run.steps=2,-1", "hydra.sweep.dir={s}/runs/sw2"],
             "run.steps=-1", check=_no_job_ran("sw2")),
        Case("sw3", "plan ~model (a required group deleted)", plan_argv("~model"), "~model"),
        Case("ray1", "DA with LOCOJAX_RAY_ADDRESS=127.0.0.1:1 (nothing listening)",
             run_argv("{s}/runs/ray1", "mesh=cpu", "mesh.hosts=3", experiment="arith_da"),
             "LOCOJAX_RAY_ADDRESS=127.0.0.1:1", runner=_with_env(
                 LOCOJAX_RAY_ADDRESS="127.0.0.1:1")),
        Case("ray2", "DA run: listening sockets outside loopback, then SIGINT",
             run_argv("{s}/runs/ray2", "mesh=cpu", "mesh.hosts=3", "run.steps=200",
                      "run.checkpoint_every=50", experiment="arith_da"), "SIGINT",
             rc=(130,), runner=ray_sockets, check=_nothing_outside("ray2")),
    ]
    return out

# ---- end of issue 28 items 4-6 (r28b) ------------------------------------------------------


# ---- issue 41 (r41): the resume record, user code, the run directory's files, limits -------

REVERSE = ROOT / "examples" / "reverse"
CUSTOM = ["workload=custom", f"+workload.reward_fns.exact={REVERSE / 'rewards.py'}:exact",
          "workload.correct=exact", "algorithm.sft_warmup_steps=0", "run.eval_every=0"]
EXIT_AT_IMPORT = "import sys\nsys.exit(0)\n\ndef x(completions, **kw):\n    return [1.0]\n"


def custom_run(case_id: str, data: str = f"{REVERSE / 'train.jsonl'}"):
    """A finished 2-step run of the reverse task in runs/<case>, its train file `data`."""
    def setup(scratch: Path) -> None:
        run = scratch / "runs" / case_id
        shutil.rmtree(run, ignore_errors=True)
        argv = _sub(run_argv(str(run), *CUSTOM, f"+workload.data_files.train={data}"), scratch)
        out = subprocess.run([PY, *argv], capture_output=True, env=_env(), cwd=ROOT, timeout=900)
        assert out.returncode == 0, out.stderr.decode()[-2000:]
    return setup


def _copied_data_then_changed(case_id: str):
    def setup(scratch: Path) -> None:
        data = scratch / f"{case_id}.jsonl"
        shutil.copy(REVERSE / "train.jsonl", data)
        custom_run(case_id, str(data))(scratch)
        data.write_text(data.read_text() + data.read_text().splitlines()[0] + "\n")  # a row more
    return setup


def _lock_linked(case_id: str):
    def damage(d: Path) -> None:
        target = d.parent / f"{case_id}-target.txt"
        target.write_text("keep me\n")
        (d / ".locojax.lock").unlink(missing_ok=True)
        (d / ".locojax.lock").symlink_to(target)
    return damage


def _target_kept(case_id: str):
    def check(scratch: Path) -> str | None:
        text = (scratch / f"{case_id}-target.txt").read_text()
        return None if text == "keep me\n" else "the lock's target was written"
    return check


def _metrics_linked(d: Path) -> None:
    (d / "elsewhere.jsonl").write_text((d / "metrics.jsonl").read_text())
    (d / "metrics.jsonl").unlink()
    (d / "metrics.jsonl").symlink_to(d / "elsewhere.jsonl")


def _signal_after_rows(sig: signal.Signals, rows: int = 2):
    def runner(case: Case, scratch: Path) -> tuple[int, str, str]:
        proc = _popen(case, scratch)
        _wait_rows(scratch / "runs" / case.id / "metrics.jsonl", rows, proc)
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=300)
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    return runner


def _export_of_step(case_id: str, step: int, run: str = "ck"):
    def check(scratch: Path) -> str | None:
        d = scratch / (f"ck_{case_id}" if run == "ck" else f"runs/{case_id}")
        marker = d / "hf" / "locojax_export.json"
        got = json.loads(marker.read_text()).get("step") if marker.is_file() else None
        return None if got == step else f"hf/ is the export of step {got}, not {step}"
    return check


def cases_r41() -> list[Case]:
    return [
        Case("u01", "resume adding a reward function",
             run_argv("{s}/runs/u01", *CUSTOM, f"+workload.data_files.train={REVERSE}/train.jsonl",
                      "run.steps=4", f"+workload.reward_fns.again={REVERSE}/rewards.py:exact"),
             "workload.reward_fns.again=(absent) there", setup=custom_run("u01")),
        Case("u02", "resume with the train file's contents changed",
             run_argv("{s}/runs/u02", *CUSTOM, "+workload.data_files.train={s}/u02.jsonl",
                      "run.steps=4"),
             "workload.data_file_sha256.train=", setup=_copied_data_then_changed("u02")),
        Case("u03", "a reward file that calls sys.exit(0) at import",
             run_argv("{s}/runs/u03", *CUSTOM[3:], "workload=custom",
                      f"+workload.data_files.train={REVERSE}/train.jsonl",
                      "+workload.reward_fns.x={s}/exit_reward.py:x", "workload.correct=x"),
             "exit_reward.py",
             setup=lambda s: (s / "exit_reward.py").write_text(EXIT_AT_IMPORT) and None),
        Case("u04", ".locojax.lock a symbolic link to a file", run_argv("{s}/ck_u04",
                                                                       "run.steps=6"),
             ".locojax.lock: a symbolic link (to", setup=copy_run("u04", _lock_linked("u04")),
             check=_target_kept("u04")),
        Case("u05", "metrics.jsonl a symbolic link to a file", run_argv("{s}/ck_u05",
                                                                       "run.steps=8"),
             "metrics.jsonl: a symbolic link (to", setup=copy_run("u05", _metrics_linked),
             check=plan_kept("u05")),
        Case("u06", "sample: 9 MiB on standard input", SAMPLE, "more than 8 MiB",
             stdin=b"y" * (9 << 20)),
        Case("u07", "workload.reward_memory_mb=100", plan_argv("workload.reward_memory_mb=100"),
             "workload.reward_memory_mb=100"),
        Case("u08", "SIGHUP mid-run (a closed terminal)",
             run_argv("{s}/runs/u08", "run.steps=200", "run.checkpoint_every=50"),
             "stopped by SIGHUP after step", rc=(129,), runner=_signal_after_rows(
                 signal.SIGHUP)),
        Case("u09", "stdout closed after one line (| head -1)",
             [*run_argv("{s}/runs/u09"), "|", "head", "-1"], "weights:", expect="ok",
             rc=(0,), shell=True, check=_export_of_step("u09", 2, run="runs")),
        Case("u10", "hf/ left by a 4-step export, checkpoint 6 the newest",
             run_argv("{s}/ck_u10", "run.steps=6", "run.checkpoint_every=2"),
             "final policy", expect="ok", rc=(0,),
             setup=copy_run("u10", _write("hf/locojax_export.json", '{"step": 4}\n')),
             check=_export_of_step("u10", 6)),
        Case("u11", "2 emulated hosts in a run directory named 'run (1),b'",
             run_argv("\"'{s}/runs/u11/run (1),b'\"", "mesh=cpu", "mesh.hosts=2"),
             "final policy", expect="ok", rc=(0,), shell=True),
    ]

# ---- end of issue 41 (r41) -------------------------------------------------------------------


# ---- issue 62 (r62): a run directory's damaged files, user environments, chat templates,
# ---- checkpoint numbers, the turn format, one warning line a step -------------------------

TURNS = ["model.tokenizer=ascii", "model.vocab=100", "workload.max_turns=3",
         "workload.prompts_per_step=4", "workload.group_size=4", "workload.env_timeout_s=1",
         "sampling.schedule=refill"]
"""The multi-turn runs' settings: the plain turn format, small batches, refill."""
ENVS = '''
import os, subprocess, sys, time
if os.environ.get("R62_MOVE") == "1":  # at import: the trainer must not notice
    os.chdir("/")
    os.environ["HOME"] = "/nowhere"
    sys.path.insert(0, "/nowhere")


class Bad:
    def __init__(self, row):
        self.turn = 0

    def reset(self):
        if os.environ.get("R62_RESET") == "wizard":
            return [{"role": "wizard", "content": "x"}]
        if os.environ.get("R62_SPAWN") == "1":
            with open(os.environ["R62_PIDS"], "a") as f:
                for new in (False, True):
                    f.write(f"{subprocess.Popen(['sleep', '600'], start_new_session=new).pid}\\n")
        return [{"role": "user", "content": "2+3="}]

    def step(self, reply):
        self.turn += 1
        if os.environ.get("R62_STEP") == "str":
            return "not a tuple"
        hung = os.environ.get("R62_PIDS", "") + ".hung"
        if os.environ.get("R62_STEP") == "hang" and not os.path.exists(hung):
            open(hung, "w").close()  # one step of the run hangs
            time.sleep(600)
        if os.environ.get("R62_STEP") == "raise" and self.turn == 2:
            raise RuntimeError("boom on turn 2")
        return [{"role": "user", "content": "again"}], 0.0, False
'''


def _envs(scratch: Path) -> None:
    (scratch / "r62").mkdir(exist_ok=True)
    (scratch / "r62" / "envs.py").write_text(ENVS)
    for left in (scratch / "r62").glob("*.pids*"):
        left.unlink()


def env_runner(**extra: str):
    """`execute` with the environment class's switches set; its output kept for the check."""
    def runner(case: Case, scratch: Path) -> tuple[int, str, str]:
        env = {**_env(), **{k: v.replace("{s}", str(scratch)) for k, v in extra.items()}}
        out = subprocess.run([PY, *_sub(case.argv, scratch)], capture_output=True, timeout=900,
                             env=env, cwd=ROOT, stdin=subprocess.DEVNULL)
        got = out.stdout.decode(errors="replace"), out.stderr.decode(errors="replace")
        (scratch / "runs" / case.id).mkdir(parents=True, exist_ok=True)
        (scratch / "runs" / case.id / "output.txt").write_text(got[0] + got[1])
        return out.returncode, *got
    return runner


def _step_lines(case_id: str, steps: int):
    """Exactly one environment warning line per step, and the steps' rows."""
    def check(scratch: Path) -> str | None:
        d = scratch / "runs" / case_id
        said = re.findall(r"step (\d+): environment ", (d / "output.txt").read_text())
        rows = len((d / "metrics.jsonl").read_text().splitlines())
        return None if said == [str(i + 1) for i in range(steps)] and rows == steps else (
            f"environment lines of steps {said}, {rows} rows")
    return check


def _nothing_left(case_id: str):
    """No process the environment started still runs."""
    def check(scratch: Path) -> str | None:
        import psutil
        time.sleep(1.5)
        pids = [int(x) for x in (scratch / "r62" / f"{case_id}.pids").read_text().split()]
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        return f"{len(alive)} of {len(pids)} processes left" if alive else None
    return check


def _rows_then(case_id: str, n: int):
    def check(scratch: Path) -> str | None:
        rows = (scratch / f"ck_{case_id}" / "metrics.jsonl").read_text().splitlines()
        steps = [json.loads(r).get("step") for r in rows]
        return None if steps == list(range(n)) else f"rows {steps}"
    return check


def _append(rel: str, data: bytes) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        with open(d / rel, "ab") as f:
            f.write(data)
    return damage


def _template(template: str) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        (d / "tokenizer_config.json").write_text(json.dumps(cfg | {"chat_template": template}))
    return edit


def _tensor_int(d: Path) -> None:
    _tensors(lambda t: t.update({"model.layers.0.self_attn.q_proj.weight": t[
        "model.layers.0.self_attn.q_proj.weight"].astype("int32")}))(d)


def _token_5000(d: Path) -> None:
    data = json.loads((d / "tokenizer.json").read_text())
    data["model"]["vocab"]["Z"] = 5000
    (d / "tokenizer.json").write_text(json.dumps(data))


def _not_run(scratch: Path) -> str | None:
    return "the template ran a command" if Path("/tmp/r62o").exists() else None


def cases_r62() -> list[Case]:
    resume = ("run.steps=8", "run.checkpoint_every=2")
    ck = [  # id, what, damage, resume overrides, expect, the name, check
        ("r62a", "metrics.jsonl: a last line {} (KeyError 'step' before)",
         _append("metrics.jsonl", b"{}\n"), resume, "ok", "line 7 is not a metrics row", 8),
        ("r62b", "metrics.jsonl: a line of bytes that are not UTF-8",
         _append("metrics.jsonl", b"\xff\xfe\n"), resume, "ok", "(not UTF-8)", 8),
        ("r62c", ".locojax.lock: {\"pid\": -1, \"host\": 7}",
         _write(".locojax.lock", '{"pid": -1, "host": 7}'), resume, "ok",
         "holds no lease a run wrote", 8),
        ("r62d", "plan.json empty (the record intact)", _write("plan.json", ""), resume, "ok",
         "the plan is written again", 8),
        ("r62e", "resolved_config.json cut in half", lambda d: (d / "resolved_config.json")
         .write_text((d / "resolved_config.json").read_text()[:300]), resume, "ok",
         "checked against plan.json instead", 8),
        ("r62f", "provenance.json [1, 2]", _write("provenance.json", "[1, 2]"), resume, "error",
         "provenance.json: damaged", None),
        ("r62g", "checkpoints/6 meta {\"format\": 1} (no step, no fingerprint)",
         _write("checkpoints/6/meta/metadata", '{"format": 1}'), resume, "error",
         "lacks step, config_fingerprint", None),
        ("r62h", "checkpoints/6 meta not JSON (an export-less run)",
         _without_export(_write("checkpoints/6/meta/metadata", "{oops")),
         ("run.steps=6", "run.checkpoint_every=2"), "ok",
         "resumed from the checkpoint of step 4", 6),
        ("r62i", "hf/locojax_export.json not JSON", _write("hf/locojax_export.json", "{oops"),
         ("run.steps=6", "run.checkpoint_every=2"), "ok", "the final export is written again",
         6)]
    out = [Case(cid, what, run_argv(f"{{s}}/ck_{cid}", *overrides), name, expect=expect,
                rc=(0,) if expect == "ok" else (2,), setup=copy_run(cid, damage),
                # provenance is read after the launch wrote its plan: only the meta's
                # refusal comes before any write
                check=_rows_then(cid, rows) if rows else plan_kept(cid) if cid == "r62g"
                else None)
           for cid, what, damage, overrides, expect, name, rows in ck]
    env = "workload.env={s}/r62/envs.py:Bad"
    out += [
        Case("r62j", "an environment whose step returns a str",
             run_argv("{s}/runs/r62j", *TURNS, env), "envs.py:Bad.step returned 'not a tuple'",
             setup=_envs, runner=env_runner(R62_STEP="str")),
        Case("r62k", "an environment whose reset returns a 'wizard' message",
             run_argv("{s}/runs/r62k", *TURNS, env), "envs.py:Bad.reset returned",
             setup=_envs, runner=env_runner(R62_RESET="wizard")),
        Case("r62l", "an environment hanging past env_timeout_s=1, moving cwd, environ and "
             "sys.path at import, starting processes in and out of its group",
             run_argv("{s}/runs/r62l", *TURNS, env), "timed out after 1 s", expect="ok",
             rc=(0,), setup=_envs, runner=env_runner(
                 R62_STEP="hang", R62_MOVE="1", R62_SPAWN="1", R62_PIDS="{s}/r62/r62l.pids"),
             check=_nothing_left("r62l")),
        Case("r62m", "an environment raising on turn 2, 2 steps under refill (135 lines "
             "before)", run_argv("{s}/runs/r62m", *TURNS, env), "boom on turn 2",
             expect="ok", rc=(0,), setup=_envs, runner=env_runner(R62_STEP="raise"),
             check=_step_lines("r62m", 2)),
        Case("r62n", "the char model with an environment (arith_co defaults)",
             run_argv("{s}/runs/r62n", env), "model.tokenizer=ascii model.vocab=100",
             setup=_envs),
    ]
    return out + _r62_checkpoint_cases()

def _r62_checkpoint_cases() -> list[Case]:
    """Issue 62's chat templates and checkpoint files (items 4 and 5)."""
    sample = lambda cid: [*SAMPLE[:2], f"model.checkpoint={{s}}/sck/{cid}", "model.tokenizer="  # noqa: E731
                          "checkpoint", *SAMPLE[4:], "prompt='3+5='"]
    return [Case(cid, what, sample(cid), name, setup=hf_variant(cid, change),
                 check=_not_run if cid == "r62o" else None)
            for cid, what, change, name in [
                ("r62o", "chat_template: cycler.__init__.__globals__.os.popen(...)",
                 _template("{{ cycler.__init__.__globals__.os.popen('touch /tmp/r62o') }}"),
                 "tokenizer_config.json: chat template reaches for Python's internals"),
                ("r62p", "chat_template: range(100000) inside range(100000)", _template(
                    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                    "{% endfor %}"), "more than 2000000 steps"),
                ("r62q", "chat_template: 'x' * 100000000", _template("{{ 'x' * 100000000 }}"),
                 "repeated a value 100000000 times"),
                ("r62r", "config.json num_hidden_layers 100000",
                 _config(lambda c: c.update(num_hidden_layers=100000)),
                 "num_hidden_layers=100000: must be in"),
                ("r62s", "config.json vocab_size -5", _config(lambda c: c.update(vocab_size=-5)),
                 "vocab_size=-5: must be in"),
                ("r62t", "config.json num_attention_heads 3 (2 kv heads)",
                 _config(lambda c: c.update(num_attention_heads=3)),
                 "num_attention_heads=3: must be a multiple of num_key_value_heads=2"),
                ("r62u", "q_proj of layer 0 stored as int32", _tensor_int,
                 "self_attn.q_proj.weight is stored as I32"),
                ("r62v", "tokenizer.json: a token of id 5000 (vocab 32)", _token_5000,
                 "has id 5000, past the model's vocab_size 32")]]

# ---- end of issue 62 (r62) -------------------------------------------------------------------


def _immutable_cwd(case: Case, scratch: Path) -> tuple[int, str, str]:
    d = scratch / "immut_cwd"
    if d.exists():
        subprocess.run(["chattr", "-i", str(d)], capture_output=True)
        shutil.rmtree(d)
    d.mkdir()
    subprocess.run(["chattr", "+i", str(d)], check=True)
    try:
        env = {**_env(), "PYTHONPATH": str(ROOT)}
        out = subprocess.run([PY, *case.argv], capture_output=True, timeout=600, env=env, cwd=d)
        return out.returncode, out.stdout.decode(errors="replace"), out.stderr.decode(
            errors="replace")
    finally:
        subprocess.run(["chattr", "-i", str(d)], capture_output=True)


def judge(case: Case, rc: int, out: str, err: str, lost: str | None) -> tuple[str, str]:
    """(verdict, the line shown in the table). A run's progress lines on stderr
    (`step i/n (p%) ...`, runtime.progress) are not counted: they are not an error."""
    lines = [line for line in err.splitlines()
             if line.strip() and not PROGRESS.match(line)]
    traceback = any(m in out + err for m in TRACEBACK_MARKS)
    if case.expect == "ok":
        shown = next((x for x in (out + "\n" + err).splitlines() if case.names and case.names
                      in x), lines[-1] if lines else "")
        ok = rc in case.rc and not traceback and case.names in out + err and lost is None
        return ("PASS" if ok else "FAIL"), shown
    shown = lines[-1] if lines else ""
    ok = (rc in case.rc and len(lines) == 1 and not traceback and case.names in shown
          and lost is None)
    return ("PASS" if ok else "FAIL"), shown


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scratch", type=Path, default=Path("/tmp/locojax-bad-inputs"))
    p.add_argument("--only", default="", help="comma-separated case ids")
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args()
    args.scratch.mkdir(parents=True, exist_ok=True)
    only = set(filter(None, args.only.split(",")))
    rows = ["| id | input | rc | out/err lines | verdict | the line |", "|---|---|---|---|---|---|"]
    passed = total = 0
    for case in [*cases(), *cases_r28b(), *cases_r41(), *cases_r62()]:  # r28b: issue 28 4-6
        if only and case.id not in only:
            continue
        total += 1
        shutil.rmtree(args.scratch / "runs" / case.id, ignore_errors=True)
        t0 = time.time()
        try:
            if case.setup:
                case.setup(args.scratch)
            runner = _immutable_cwd if case.extra.get("immutable_cwd") else (
                case.runner or execute)
            rc, out, err = runner(case, args.scratch)
            lost = case.check(args.scratch) if case.check else None
            verdict, line = judge(case, rc, out, err, lost)
            if lost:
                line += f" [{lost}]"
        except Exception as e:  # a broken case is reported, the others still run
            rc, out, err, verdict, line = -1, "", "", "ERROR", f"{type(e).__name__}: {e}"
        passed += verdict == "PASS"
        counts = f"{len(out.splitlines())}/{len([x for x in err.splitlines() if x.strip()])}"
        line = line.replace("|", "\\|").replace(str(args.scratch), "<s>")[:220]
        rows.append(f"| {case.id} | {case.what} | {rc} | {counts} | {verdict} | `{line}` |")
        print(rows[-1], f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    table = "\n".join(rows)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    print(f"{passed} of {total} cases pass")
    return 0 if passed == total else 1


if __name__ == "__main__":
    sys.exit(main())

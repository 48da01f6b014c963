"""`locojax-plan ... aot=true` end to end: the TPU compiler's table and JSON, its out-of-memory
as one line, the install hint without libtpu, the slices JAX describes; and CPU plans that
never load libtpu (a 2-host CPU run loads none either: test_co_runtime's LoRA run)."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import warm
from libtpu_maps import assert_no_tpu_lines, assert_none_loaded, recording, site_dir
from paths import ROOT

from compiler import compile_plan
from compiler.hardware import tpu_slice
from locojax.aot.target import child_env
from locojax.config.compose import compose_config

pytestmark = pytest.mark.tpu

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="the tpu extra (libtpu) is not installed")
needs_programs = pytest.mark.skipif(
    importlib.util.find_spec("locojax.aot.programs") is None,
    reason="locojax.aot.programs (the plan's programs for AOT compile_plan) is not here yet")
NO_LIBTPU = "import sys\nsys.modules['libtpu'] = None  # as if the tpu extra were missing\n"
SMALL = ["+experiment=gsm8k_co", "model=tiny", "workload.prompts_per_step=4",
         "workload.group_size=2", "workload.max_prompt_len=64", "workload.max_response_len=64"]
"""The tiny model and a small batch (benchmarks/aot.py's smoke case; compiles in seconds): the
CLI's table and JSON are what this checks, the figures at Qwen3-0.6B widths are
test_aot_tpu's."""


def _env(site: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    paths = [str(site)] if site else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT), env.get("PYTHONPATH", "")])
    return env | extra


def _plan(*overrides: str, env: dict[str, str] | None = None, timeout: int = 900
          ) -> subprocess.CompletedProcess:
    return warm.run([sys.executable, "-m", "locojax.plan", *overrides], cwd=ROOT,
                    env=env or _env(), capture_output=True, text=True, timeout=timeout)


def test_cpu_plans_load_no_tpu_compiler(tmp_path):
    # (named so that its tmp_path, which an error would print, holds no 'libtpu'). A 2-host
    # emulated run loads none either: test_co_runtime's LoRA run on two hosts records it.
    env, maps = recording(tmp_path, _env())
    for overrides in (["+experiment=gsm8k_co"], ["+experiment=gsm8k_co", "mesh=v5e"]):
        out = _plan(*overrides, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert_no_tpu_lines(out.stderr)
    assert_none_loaded(maps, "", processes=2)


def test_aot_without_libtpu_says_how_to_install(tmp_path):
    out = _plan("+experiment=gsm8k_co", "mesh=v5e", "mesh.chips=8", "aot=true",
                env=_env(site_dir(tmp_path, NO_LIBTPU)), timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'locojax[tpu]'" in lines[0], out.stderr
    assert lines[0].startswith("error: aot=true needs the TPU compiler (libtpu)")


@needs_libtpu
def test_every_slice_is_one_jax_describes(tmp_path):
    cases = [("v5e", 4), ("v5e", 16), ("v5e", 256), ("v6e", 8), ("v6e", 64), ("v4", 8),
             ("v4", 64), ("v5p", 16), ("v5p", 256), ("v7x", 4), ("v7x", 64), ("v7x", 256)]
    targets = []
    for mesh, chips in cases:
        topo = compile_plan(compose_config(["+experiment=gsm8k_co", f"mesh={mesh}",
                                       f"mesh.chips={chips}"])).topology
        targets.append(tpu_slice(topo.hardware, topo.chips, topo.hosts))
    script = (
        "import json, sys\nfrom jax.experimental import topologies\nout = []\n"
        "for t in json.loads(sys.argv[1]):\n"
        "    d = topologies.get_topology_desc(platform='tpu', topology_name=t[0], "
        "chip_config_name=t[1], chips_per_host_bounds=tuple(t[2]), wrap=tuple(t[3])).devices\n"
        "    out.append([len(d), len({x.process_index for x in d}), d[0].device_kind])\n"
        "print(json.dumps(out))\n")
    arg = json.dumps([[t.topology_name, t.chip_config, t.host_bounds, t.wrap] for t in targets])
    out = warm.run([sys.executable, "-c", script, arg], cwd=ROOT, capture_output=True,
                   text=True, timeout=300,
                   env=child_env(targets[0], tmp_path / "logs", base=_env()))
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for (mesh, chips), t, (devices, hosts, kind) in zip(cases, targets, got, strict=True):
        hw = compose_config([f"mesh={mesh}"]).hardware
        assert (devices, hosts, kind) == (t.devices, t.hosts, hw.device_kind), (mesh, chips)


@pytest.mark.slow
@needs_libtpu
@needs_programs
def test_aot_table_and_json_for_v5e(tmp_path):
    out = _plan(*SMALL, "mesh=v5e", "mesh.chips=4", "aot=true", "format=json")
    assert out.returncode == 0, out.stderr[-3000:]
    assert_no_tpu_lines(out.stderr)
    report = json.loads(out.stdout)["aot"]
    assert report["target"] == "v5e:2x2" and report["devices"] == 4
    programs = report["programs"]
    assert "train_step" in programs, programs
    for name, p in programs.items():
        assert p["compiler_bytes"] > 0 and p["plan_bytes"] > 0, name
        assert p["ratio"] == pytest.approx(p["plan_bytes"] / p["compiler_bytes"]), name
        assert isinstance(p["collectives"], list) and "flops" in p
    # the plan's step times use the compiled programs' efficiencies (compiler.cost.roofline)
    used = {a["name"]: a["value"] for a in json.loads(out.stdout)["cost"]["assumptions"]}
    assert set(report["efficiencies"]) == {"train_efficiency", "decode_efficiency"}
    for name, fraction in report["efficiencies"].items():
        assert fraction > 0 and used[name] == pytest.approx(min(fraction, 1.0)), name


def _refused_on_v5e(chips: str) -> str:
    """The one stderr line (exit 2) of gsm8k_co planned for a 64 GiB device, compiled for v5e
    (15.75 GiB) at `chips`."""
    out = _plan("+experiment=gsm8k_co", "mesh=v5e", chips, "aot=true",
                f"hardware.hbm_bytes={64 * 1024**3}")
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr[-3000:]
    return lines[0]


@needs_libtpu
@needs_programs
def test_a_plan_too_large_for_v5e_is_one_line():
    # the plan is made for a 64 GiB device (its batch and slots follow); v5e's compiler has
    # 15.75 GiB and refuses the train step at once (about 15 s)
    line = _refused_on_v5e("mesh.chips=4")
    head = ("error: mesh.chips=4: the TPU compiler (v5e:2x2, 4 chips) finds that train_step "
            "needs ")
    assert line.startswith(head), line
    # the compiler's own figures: more than a v5e device's 15.75 GiB (its HBM as reported)
    needed, tail = line[len(head):].split(" GiB per device, ", 1)
    assert float(needed) > 15.75 and tail.startswith("15.75 GiB available"), line
    for key in ("workload.prompts_per_step", "mesh.chips", "algorithm.remat"):
        assert key in line


@needs_libtpu
@needs_programs
def test_smallest_slice_asks_the_tpu_compiler_for_larger_ones():
    # mesh.chips=0 on the tiny model, planned for a 1 TB device without remat and one update
    # a batch (so the plan packs every row of its 1,024 x 512 tokens at once): the plan's
    # memory fit (16 chips) is refused by the compiler's train step (the head's logits);
    # 32 chips (4 hosts) fit, one host's rollout programs compiled on a one-host v5e slice
    # (v5e refuses a program on part of a larger slice). About 25 CPU-seconds (the same search
    # at Qwen3-0.6B's 28 layers and 64 GiB: about 4 minutes).
    out = _plan("+experiment=gsm8k_co", "model=tiny", "mesh=v5e", "mesh.chips=0", "aot=true",
                "hardware.hbm_bytes=1e12", "algorithm.remat=none",
                "algorithm.optimizer_steps_per_batch=1", "workload.prompts_per_step=128",
                "workload.group_size=8", "workload.max_response_len=384",
                "workload.max_prompt_len=128")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "mesh.chips=0: the TPU compiler refused 16 chips\n" in out.stdout
    assert "TPU compiler: v5e:4x8 (v5litepod-32, 4 hosts" in out.stdout
    for program in ("train_step", "rollout_prefill", "rollout_slots"):
        assert f"│ {program} " in out.stdout, program


def _children(pid: int, marker: str) -> list[int]:
    """Live processes whose parent is `pid` and whose command line holds `marker`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] not in "ZX" and marker in cmdline:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


@needs_libtpu
def test_the_compiling_process_ends_with_the_plan_command():
    """`locojax-plan ... aot=true` killed mid-compile takes its TPU compiler process with it
    (the child used to be left compiling, an orphan)."""
    plan = warm.Popen([sys.executable, "-m", "locojax.plan", *SMALL, "mesh=v5e",
                       "mesh.chips=4", "aot=true"], cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            children = _children(plan.pid, "locojax.aot.worker")
            if children or plan.poll() is not None:
                break
            time.sleep(0.1)
        assert children, "no compiling child appeared"
        plan.kill()
        plan.wait()
        for _ in range(100):
            if not _alive(children[0]):
                break
            time.sleep(0.1)
        assert not _alive(children[0])
    finally:
        plan.kill()

"""`locojax.aot.target` without the TPU compiler: the child's environment, the out-of-memory
line, `mesh.chips=0` trying larger slices, and the report's tables and JSON (the compile_plan
itself is stubbed; tests/e2e/test_aot_cli.py runs it)."""

import io
import json
import os
from dataclasses import replace

import pytest
from rich.console import Console

from compiler import PlanError, compile_plan
from compiler.cost.estimate import estimate_plan
from compiler.cost.roofline import compiled_cost, decode_ideal_bytes, with_compiled_cost
from compiler.hardware import tpu_slice
from locojax.aot import target as aot
from locojax.config.compose import compose_config
from locojax.reports.aot_view import aot_json, print_aot
from locojax.runtime.errors import UserError

GIB = 1024**3


def _cfg(*overrides: str):
    return compose_config(["+experiment=gsm8k_co", *overrides])


def _report(plan, name="train_step", peak=10 * GIB) -> aot.AotReport:
    topo = plan.topology
    program = {"name": name, "argument_bytes": 6 * GIB, "output_bytes": 6 * GIB,
               "alias_bytes": 6 * GIB, "temp_bytes": 4 * GIB, "compiler_bytes": peak,
               "plan_bytes": 9 * GIB, "ratio": 0.9, "flops": 1.5e15, "plan_flops": 1.2e15,
               "flops_note": "scan bodies once", "plan_network_bytes": 2 * GIB,
               "collectives": [{"kind": "all-gather", "count": 3, "bytes": GIB}],
               "compile_s": 12.5}
    return aot.AotReport(tpu_slice(topo.hardware, topo.chips, topo.hosts), (program,), 30.0,
                         55.0, 2 * GIB)


def test_child_env_sets_what_libtpu_needs_and_leaves_ours_alone(tmp_path):
    before = dict(os.environ)
    plan = compile_plan(_cfg("mesh=v5e", "mesh.chips=16"))
    target = tpu_slice(plan.topology.hardware, 16, plan.topology.hosts)
    env = aot.child_env(target, tmp_path / "logs", base={"PATH": "/bin", "JAX_PLATFORMS": ""})
    assert env == {"PATH": "/bin", "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
                   "TPU_ACCELERATOR_TYPE": "v5litepod-16", "TPU_WORKER_HOSTNAMES": "localhost",
                   "TPU_LOG_DIR": str(tmp_path / "logs")}
    assert dict(os.environ) == before


def test_out_of_memory_is_one_line_naming_program_bytes_and_keys():
    cfg = _cfg("mesh=v5e", "mesh.chips=8")
    plan = compile_plan(cfg)

    def refuse(_plan):
        raise aot.ProgramDoesNotFit("train_step", int(17.2 * GIB), int(15.75 * GIB), "OOM")

    with pytest.raises(PlanError) as err:
        aot.check_on_tpu(cfg, plan, compile_plan, compile_fn=refuse)
    line = str(err.value)
    assert (err.value.key, err.value.rule_id) == ("mesh.chips", "tpu_memory")
    assert line.startswith("mesh.chips=8: the TPU compiler (v5e:2x4, 8 chips)")
    for words in ("train_step needs 17.20 GiB per device", "15.75 GiB available",
                  "workload.prompts_per_step", "algorithm.remat", "mesh.chips"):
        assert words in line
    assert "\n" not in line


def test_rollout_out_of_memory_names_the_rollout_keys():
    cfg = _cfg("mesh=v5e", "mesh.chips=8")

    def refuse(_plan):
        raise aot.ProgramDoesNotFit("rollout_slots", None, None, "OOM")

    with pytest.raises(PlanError) as err:
        aot.check_on_tpu(cfg, compile_plan(cfg), compile_plan, compile_fn=refuse)
    assert "sampling.slots" in str(err.value) and "15.75 GiB available" in str(err.value)


def test_smallest_slice_takes_the_tpu_compilers_verdict():
    cfg = _cfg("mesh=v5e", "mesh.chips=0")
    plan = compile_plan(cfg)
    first = plan.topology.chips
    seen = []

    def fits_from_the_second(candidate):
        seen.append(candidate.topology.chips)
        if len(seen) < 2:
            raise aot.ProgramDoesNotFit("train_step", 20 * GIB, int(15.75 * GIB), "OOM")
        return _report(candidate)

    chosen, report = aot.check_on_tpu(cfg, plan, compile_plan, compile_fn=fits_from_the_second)
    assert seen[0] == first and chosen.topology.chips == seen[1] > first
    assert report.chips_tried == (first,)
    assert chosen.topology.chips_from == plan.topology.chips_from


def test_smallest_slice_gives_up_after_its_tries():
    cfg = _cfg("mesh=v5e", "mesh.chips=0")

    def never(_plan):
        raise aot.ProgramDoesNotFit("train_step", 20 * GIB, int(15.75 * GIB), "OOM")

    with pytest.raises(PlanError) as err:
        aot.check_on_tpu(cfg, compile_plan(cfg), compile_plan, compile_fn=never)
    assert str(err.value).startswith("mesh.chips=0: ") and "also refused" in str(err.value)


def test_without_libtpu_aot_says_how_to_install(monkeypatch):
    monkeypatch.setattr(aot, "tpu_compiler_installed", lambda: False)
    with pytest.raises(UserError, match=r"pip install 'locojax\[tpu\]'"):
        aot.compile_on_tpu(compile_plan(_cfg("mesh=v5e", "mesh.chips=8")))


def test_a_gpu_plan_is_not_a_tpu_target():
    with pytest.raises(PlanError) as err:
        aot.compile_on_tpu(compile_plan(_cfg("mesh=h100")))
    assert (err.value.key, err.value.rule_id) == ("mesh.kind", "tpu_target")


def test_tables_and_json_key():
    plan = compile_plan(_cfg("mesh=v5e", "mesh.chips=8"))
    report = _report(plan)
    out = io.StringIO()
    print_aot(report, plan, Console(file=out, width=200))
    text = out.getvalue()
    for words in ("v5e:2x4", "train_step", "10.00", "9.00", "0.90", "all-gather",
                  "scan bodies once", "55 CPU-s", "train_efficiency 0.800 (train step: plan "
                  "FLOPs / compiled matmul FLOPs; conf/hardware/v5e.yaml: "):
        assert words in text
    data = json.loads(json.dumps(aot_json(report, plan)))
    assert data["efficiencies"] == {"train_efficiency": 0.8}
    assert data["target"] == "v5e:2x4"
    program = data["programs"]["train_step"]
    assert (program["compiler_bytes"], program["plan_bytes"], program["ratio"]) == (
        10 * GIB, 9 * GIB, 0.9)
    assert program["flops"] == 1.5e15 and program["collectives"][0]["kind"] == "all-gather"


def test_aot_plans_step_times_take_the_compiled_programs_efficiencies():
    plan = compile_plan(_cfg("mesh=v5e", "mesh.chips=8"))
    slots = {"name": "rollout_slots", "flops": 1e12, "plan_flops": 1e12,
             "bytes_accessed": 4 * decode_ideal_bytes(plan)}
    train = {"name": "train_step", "flops": 4e15, "plan_flops": 1e15}
    compiled = with_compiled_cost(plan, (train, slots))
    cost = replace(plan.topology.hardware.cost, train_efficiency=0.25, decode_efficiency=0.25)
    expected = estimate_plan(plan, cost)
    assert (compiled.cost.co, compiled.cost.da, compiled.cost.single) == (
        expected.co, expected.da, expected.single)
    assert compiled.cost.co.train_s == pytest.approx(
        plan.cost.co.train_s * plan.topology.hardware.cost.train_efficiency / 0.25)
    used = {a.name: a for a in compiled.cost.assumptions}
    assert used["train_efficiency"].value == 0.25
    assert "aot=true: train_efficiency 0.250, decode_efficiency 0.250" in used[
        "train_efficiency"].source
    over = compiled_cost(plan, ({**train, "flops": 5e14},))
    assert over.capped == ("train_efficiency",) and over.cost.train_efficiency == 1.0
    assert over.fractions == {"train_efficiency": 2.0}

"""JSON round trip, the no-JAX import rule, and plans at 405B scale (their compile time is
benchmarks/compile.py's figure)."""

import json
import subprocess
import sys

import pytest
from compiler_cases import make_config
from paths import ROOT

from compiler import PlanError, compile_plan, from_data, plan_from_json, plan_to_json, to_data
from compiler.axes import MeshAxis
from compiler.config import MeshKind, PlacementMode
from compiler.plan import ExecutionPlan


def _v7x_405b(mode):
    return make_config(model="llama3_405b", workload="numina_cot", hardware="v7x",
                       mesh={"kind": "tpu", "chips": 512},
                       placement={"mode": mode, "rollout_fraction": 0.75, "max_staleness": 1})


def test_round_trip_keeps_tuples_enums_and_dict_keys():
    plan = compile_plan(make_config(mesh={"kind": "cpu", "hosts": 4, "devices_per_host": 2},
                               placement={"mode": "disaggregated", "rollout_fraction": 0.75}))
    back = plan_from_json(plan_to_json(plan))
    assert back == plan
    assert isinstance(back.partitions.rollout_hosts, tuple)
    assert type(back.topology.mesh_kind) is MeshKind
    assert type(back.placement.mode) is PlacementMode
    assert all(type(k) is MeshAxis for k in back.sharding.train.mesh)
    assert all(type(a) is MeshAxis for spec in back.sharding.train.specs.values()
               for a in spec if a is not None)
    assert isinstance(back.transfer.rounds[0], tuple)


def test_json_has_the_documented_sections():
    data = json.loads(plan_to_json(compile_plan(make_config(
        mesh={"kind": "cpu", "hosts": 2, "devices_per_host": 2}))))
    assert {"topology", "partitions", "sharding", "batch", "transfer", "schedule",
            "cost"} <= set(data)
    assert set(data["partitions"]) == {"rollout_hosts", "trainer_hosts", "rollout_devices",
                                       "trainer_devices"}
    assert data["sharding"]["train"]["mesh"] == {"data": 2, "fsdp": 2}
    assert data["sharding"]["train"]["specs"]["embed/embedding"] == [None, "fsdp"]
    assert data["topology"]["hardware"]["name"] == "cpu"


def test_decoding_rejects_unknown_keys_and_wrong_types():
    data = to_data(compile_plan(make_config(mesh={"kind": "cpu", "hosts": 1,
                                             "devices_per_host": 1})))
    data["batch"]["bogus"] = 1
    with pytest.raises(ValueError, match="bogus"):
        from_data(ExecutionPlan, data)
    del data["batch"]["bogus"]
    data["partitions"]["rollout_devices"] = "one"
    with pytest.raises(TypeError):
        from_data(ExecutionPlan, data)


def test_plan_error_is_one_line_and_picklable():
    import pickle

    with pytest.raises(PlanError) as err:
        compile_plan(make_config(hardware="v7x", mesh={"kind": "tpu", "chips": 12}))
    copy = pickle.loads(pickle.dumps(err.value))
    assert (copy.key, copy.value, copy.rule_id, str(copy)) == (
        err.value.key, err.value.value, err.value.rule_id, str(err.value))


@pytest.mark.parametrize("mode", ["colocated", "disaggregated", "auto"])
def test_405b_on_512_chips_compiles_and_round_trips(mode):
    plan = compile_plan(_v7x_405b(mode))
    assert plan.topology.hosts == 128 and plan.model.param_count > 400e9
    assert plan_from_json(plan_to_json(plan)) == plan


def test_import_compiler_loads_no_jax_hydra_or_runtime():
    code = ("import importlib, pkgutil, sys, compiler\n"
            "for m in pkgutil.walk_packages(compiler.__path__, 'compiler.'):\n"
            "    importlib.import_module(m.name)\n"
            "bad = {'jax', 'flax', 'hydra', 'omegaconf', 'locojax'} & "
            "{m.split('.')[0] for m in sys.modules}\nassert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)

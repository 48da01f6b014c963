"""Golden plans of the shipped experiments. Regenerate with UPDATE_GOLDEN=1 after a deliberate
change: `UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/compiler/test_compiler_golden.py`.

The `cost` section is compared in its own test, so a cost-model change is told apart from a
layout change."""

import functools
import json
import os

import pytest
from paths import GOLDEN

from compiler import compile_plan, plan_from_json, plan_to_json
from locojax.config.compose import compose_config

V7X_64 = ["mesh=v7x", "mesh.chips=64"]
CPU_4x2 = ["mesh=cpu", "mesh.hosts=4", "mesh.devices_per_host=2"]
CASES = {
    "gsm8k_co": V7X_64, "gsm8k_da": V7X_64, "numina_co": V7X_64, "numina_da": V7X_64,
    "gsm8k_tools_co": V7X_64, "arith_co": CPU_4x2, "arith_da": CPU_4x2,
    "arith_tools_co": CPU_4x2,
}


@functools.cache
def _plan_text(name: str) -> str:
    text = plan_to_json(compile_plan(compose_config([f"+experiment={name}", *CASES[name]])))
    path = GOLDEN / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text + "\n")
    assert path.exists(), f"no golden plan {path}; run with UPDATE_GOLDEN=1"
    return text


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_plan(name):
    text = _plan_text(name)
    want, got = json.loads((GOLDEN / f"{name}.json").read_text()), json.loads(text)
    changed = sorted(k for k in want.keys() | got.keys()
                     if k != "cost" and want.get(k) != got.get(k))
    assert not changed, f"{name}: plan sections differ from {name}.json: {changed}"
    want["cost"] = got["cost"] = None
    assert plan_from_json(json.dumps(want)) == plan_from_json(json.dumps(got))


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_cost(name):
    want = json.loads((GOLDEN / f"{name}.json").read_text())["cost"]
    assert json.loads(_plan_text(name))["cost"] == want, f"{name}: cost estimate changed"


def test_golden_da_plans_split_hosts():
    plan = plan_from_json((GOLDEN / "gsm8k_da.json").read_text())
    assert len(plan.partitions.rollout_hosts) == 12 and len(plan.partitions.trainer_hosts) == 4
    assert plan.transfer.link == "ici"

"""Properties over generated configs: every plan keeps its invariants, every rejection names a
registered key (with the value that key holds) and a registered rule."""

import dataclasses
from collections import Counter
from enum import Enum

import hypothesis_profiles  # noqa: F401  (loads the profile named by HYPOTHESIS_PROFILE)
from compiler_cases import config_value, make_config
from hypothesis import event, given
from hypothesis import strategies as st

from compiler import PlanError, compile_plan, plan_from_json, plan_to_json
from compiler.errors import KEYS, RULES
from compiler.model_entry import RUNTIME_FAMILIES
from compiler.params import param_table

MODELS = ["tiny"] * 4 + ["qwen3_0_6b"] * 3 + ["qwen3_1_7b", "qwen3_4b", "qwen3_8b",
                                                "qwen3_14b", "qwen3_32b", "llama3_70b",
                                                "llama3_405b"]


@st.composite
def machines(draw):
    kind = draw(st.sampled_from(["cpu", "cpu", "tpu", "tpu", "gpu", "auto"]))
    if kind == "cpu":
        hw = draw(st.sampled_from(["cpu"] * 9 + ["v7x"]))
        return hw, {"kind": "cpu", "hosts": draw(st.integers(1, 8)),
                    "devices_per_host": draw(st.sampled_from([1, 2, 3, 4, 8]))}
    if kind == "tpu":
        hw = draw(st.sampled_from(["v7x", "v7x", "v5p", "h100"]))
        chips = draw(st.sampled_from([2, 4, 8, 12, 16, 32, 48, 64, 128, 192, 256, 512]))
        return hw, {"kind": "tpu", "chips": chips}
    if kind == "gpu":
        return "h100", {"kind": "gpu", "chips": draw(st.sampled_from([1, 2, 3, 4, 8, 16, 24,
                                                                      64]))}
    return "cpu", {"kind": "auto"}


@st.composite
def configs(draw):
    hardware, mesh = draw(machines())
    mesh["rollout_tensor_parallel"] = draw(st.sampled_from([1, 1, 1, 2, 4, 8, 16, 3]))
    placement = {"mode": draw(st.sampled_from(["colocated", "disaggregated",
                                                "disaggregated", "auto"])),
                 "rollout_fraction": draw(st.sampled_from([0.25, 0.5, 0.75, 0.3, 0.9, 0.0,
                                                           1.0])),
                 "max_staleness": draw(st.sampled_from([0, 1, 2]))}
    workload = {"prompts_per_step": draw(st.sampled_from([1, 8, 12, 16, 24, 48, 64, 96, 384])),
                "group_size": draw(st.sampled_from([1, 2, 4, 8, 16]))}
    return make_config(
        model=draw(st.sampled_from(MODELS)),
        workload=draw(st.sampled_from(["arith", "gsm8k", "numina_cot"])),
        hardware=hardware, mesh=mesh, placement=placement,
        controller=draw(st.sampled_from(["local", "local", "single"])),
        overrides={"workload": workload,
                   "algorithm": {"optimizer_steps_per_batch": draw(st.sampled_from([1, 1, 2, 4])),
                                 "kl_coef": draw(st.sampled_from([0.0, 0.01])),
                                 "sft_warmup_steps": draw(st.sampled_from([0, 0, 5]))}})


def _check_error(cfg, err: PlanError) -> None:
    assert err.key in KEYS and err.rule_id in RULES
    assert err.value == config_value(cfg, err.key)
    text = str(err)
    assert text.startswith(f"{err.key}={err.value}: ") and "\n" not in text


def _check_partitions(plan) -> None:
    parts, topo = plan.partitions, plan.topology
    hosts = set(range(topo.hosts))
    if plan.placement.mode == "disaggregated":
        assert not set(parts.rollout_hosts) & set(parts.trainer_hosts)
        assert set(parts.rollout_hosts) | set(parts.trainer_hosts) == hosts
        devices = Counter((h, d) for role in (parts.rollout_hosts, parts.trainer_hosts)
                          for h in role for d in range(topo.devices_per_host))
        assert set(devices.values()) == {1} and len(devices) == topo.devices
    else:
        assert set(parts.rollout_hosts) == set(parts.trainer_hosts) == hosts


def _check_specs(plan) -> None:
    table = param_table(plan.model.config)
    for role in (plan.sharding.train, plan.sharding.rollout):
        assert set(role.specs) == {p.name for p in table}
        for p in table:
            spec = role.specs[p.name]
            assert len(spec) == len(p.shape)
            for dim, axis in zip(p.shape, spec, strict=True):
                assert axis is None or dim % role.mesh[axis] == 0, (p.name, axis)
    train_devices = 1
    for size in plan.sharding.train.mesh.values():
        train_devices *= size
    assert train_devices == plan.partitions.trainer_devices


def _check_transfer(plan) -> None:
    t, parts = plan.transfer, plan.partitions
    table = param_table(plan.model.config)
    rows = Counter()
    for sl in t.slices:
        for piece in sl.pieces:
            rows[piece.name] += piece.stop - piece.start
    assert rows == Counter({p.name: p.shape[0] for p in table})
    got = Counter()
    for sends in t.rounds:
        assert len({s.src for s in sends}) == len(sends), "a host sends twice in a round"
        assert len({(s.src, s.dst) for s in sends}) == len(sends), "a link is used twice"
        got.update((s.dst, s.slice) for s in sends)
    assert got == Counter((h, sl.index) for h in parts.rollout_hosts for sl in t.slices)
    if plan.placement.mode == "disaggregated":
        assert {s.src for r in t.rounds for s in r} <= set(parts.trainer_hosts)
    else:
        assert all(s.src == s.dst for r in t.rounds for s in r)


def _check_batch(plan) -> None:
    b = plan.batch
    owner = Counter()
    for r in b.prompt_ranges:
        assert r.host in plan.partitions.rollout_hosts
        owner.update(range(r.start, r.stop))
    assert owner == Counter(range(b.prompts_per_step))
    assert b.rows_per_trainer_device * plan.partitions.trainer_devices == \
        b.prompts_per_step * b.group_size


def _check_runtime_divisibility(plan) -> None:
    """Every split the runtime makes of a plan's numbers comes out even (else it raises there,
    after the start: generate's rows over its rollout replicas, make_array_from_process_local_data
    over the trainer devices, the warm-up's prompt rows). Held-out evaluation pads itself."""
    b, parts, topo = plan.batch, plan.partitions, plan.topology
    tensor = plan.sharding.rollout.mesh["tensor"]
    single = plan.controller.kind == "single"
    if plan.model.config.family in RUNTIME_FAMILIES:  # the runtime's rollout is host-local
        assert tensor <= topo.devices_per_host, (tensor, topo.devices_per_host)
    if tensor <= topo.devices_per_host:  # plan-only families may span hosts: not built here
        local_replicas = topo.devices_per_host // tensor
        assert local_replicas * tensor == topo.devices_per_host
        for r in b.prompt_ranges:
            rows = (r.stop - r.start) * b.group_size
            assert rows % local_replicas == 0, (r, local_replicas)
        if single:
            assert b.sequences_per_step % (topo.devices // tensor) == 0
    trainer_hosts = len(parts.trainer_hosts)
    assert b.sequences_per_step % parts.trainer_devices == 0
    assert (b.sequences_per_step // trainer_hosts) % (parts.trainer_devices // trainer_hosts) == 0
    if plan.algorithm.sft_warmup_steps:
        assert b.prompts_per_step % parts.trainer_devices == 0
        assert b.prompts_per_step % trainer_hosts == 0


def _same_types(a, b) -> None:
    """`a` (decoded) has the types of `b` (compiled); an int in a float field comes back float."""
    if type(a) is float and type(b) is int:
        assert a == b
        return
    assert type(a) is type(b), (a, b)
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same_types(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            _same_types(x, y)
    elif isinstance(a, dict):
        for (k1, v1), (k2, v2) in zip(a.items(), b.items(), strict=True):
            _same_types(k1, k2)
            _same_types(v1, v2)
    elif isinstance(a, Enum):
        assert a is b


@st.composite
def likely_valid_configs(draw):
    """Configs shaped to compile more often: valid slices, friendly batch sizes."""
    kind = draw(st.sampled_from(["cpu", "tpu", "gpu"]))
    if kind == "cpu":
        hardware = "cpu"
        mesh = {"kind": "cpu", "hosts": draw(st.sampled_from([1, 2, 3, 4, 6, 8])),
                "devices_per_host": draw(st.sampled_from([1, 2, 4]))}
    elif kind == "tpu":
        hardware = draw(st.sampled_from(["v7x", "v5p"]))
        mesh = {"kind": "tpu", "chips": draw(st.sampled_from([4, 8, 16, 32, 64, 128, 256]))}
    else:
        hardware, mesh = "h100", {"kind": "gpu", "chips": draw(st.sampled_from([8, 16, 32, 64]))}
    mesh["rollout_tensor_parallel"] = draw(st.sampled_from([1, 1, 2, 4]))
    placement = {"mode": draw(st.sampled_from(["colocated", "disaggregated", "auto"])),
                 "rollout_fraction": draw(st.sampled_from([0.25, 0.5, 0.75])),
                 "max_staleness": draw(st.sampled_from([0, 1]))}
    return make_config(
        model=draw(st.sampled_from(MODELS[:9])), workload=draw(st.sampled_from(["arith",
                                                                                 "gsm8k"])),
        hardware=hardware, mesh=mesh, placement=placement,
        overrides={"workload": {"prompts_per_step": draw(st.sampled_from([96, 192, 384, 768])),
                                "group_size": draw(st.sampled_from([4, 8, 16]))}})


@given(configs())
def test_plans_keep_invariants_and_rejections_name_a_rule(cfg):
    _check_config(cfg)


@given(likely_valid_configs())
def test_plans_of_likely_valid_configs_keep_invariants(cfg):
    _check_config(cfg)


def _check_config(cfg) -> None:
    try:
        plan = compile_plan(cfg)
    except PlanError as err:
        event(f"rejected: {err.rule_id}")
        _check_error(cfg, err)
        return
    event(f"compiled: {plan.placement.mode}")
    _check_partitions(plan)
    _check_specs(plan)
    _check_transfer(plan)
    _check_batch(plan)
    _check_runtime_divisibility(plan)
    back = plan_from_json(plan_to_json(plan))
    assert back == plan
    _same_types(back, plan)

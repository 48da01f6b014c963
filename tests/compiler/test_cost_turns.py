"""The cost model's turn term (`compiler.cost.phases`): each turn decodes a reply and runs
every episode's environment step, on each CO host for its own episodes and in the single
controller's driver for every host's, one round trip to the workers per turn."""

import pytest

from compiler import PlanError, compile_plan
from compiler.cost.estimate import estimate_plan
from locojax.config.compose import compose_config

TOOLS = ["+experiment=gsm8k_tools_co", "mesh=v5e", "mesh.chips=16"]
"""2 hosts of 8 chips."""


def _costs(*overrides: str):
    plan = compile_plan(compose_config([*TOOLS, *overrides]))
    est = estimate_plan(plan)
    return plan, est.co, est.single


@pytest.mark.parametrize("turns", [2, 4, 8])
def test_environment_steps_are_each_hosts_in_co_and_all_in_the_single_driver(turns):
    plan, co, single = _costs(f"workload.max_turns={turns}", "workload.env_step_s=0.01")
    hosts, cores = plan.topology.hosts, plan.topology.hardware.host_cores
    episodes = plan.batch.sequences_per_step
    assert hosts == 2
    assert co.env_s == pytest.approx(episodes / hosts / cores * turns * 0.01)
    assert single.env_s == pytest.approx(hosts * co.env_s)
    # the host work on the step's critical path holds them
    assert single.host_s - co.host_s >= single.env_s - co.env_s


def test_turns_grow_the_single_controllers_extra_seconds():
    """Each turn adds its environment steps (each host's in CO, all in the driver) and one
    launch (a round trip to every worker for the single controller, a local one in CO); the
    devices' share of a turn is the same in both."""
    costs = {t: _costs(f"workload.max_turns={t}", "workload.env_step_s=0.01",
                       "workload.max_episode_len=1024", "sampling.schedule=static")[1:]
             for t in (2, 3, 5, 9)}
    extra = {t: single.step_s - co.step_s for t, (co, single) in costs.items()}
    (co2, single2), (co3, single3) = costs[2], costs[3]
    per_turn = (single3.dispatch_s - single2.dispatch_s) - (co3.dispatch_s - co2.dispatch_s) \
        + (single2.env_s - co2.env_s) / 2
    assert per_turn > 0
    for t in (3, 5, 9):
        assert extra[t] - extra[2] == pytest.approx((t - 2) * per_turn, rel=1e-6)


def test_rollout_decodes_a_reply_per_turn():
    _, two, _ = _costs("workload.max_turns=2")
    _, eight, _ = _costs("workload.max_turns=8")
    assert 3 < eight.rollout_s / two.rollout_s <= 4
    # no environment time without an estimate of it
    assert eight.env_s == 0.0


def test_tools_need_a_second_turn():
    """A tool's result is read in the turn after its call: tools with one turn are refused
    in one line naming the key (without the tools, one turn is a single-reply run)."""
    with pytest.raises(PlanError, match=r"workload.max_turns=1: must be >= 2 when "
                                        r"workload.tools is set .*\['calculate'\]"):
        _costs("workload.max_turns=1")
    plan, _, _ = _costs("workload.max_turns=1", "~workload.tools.calculate")
    assert plan.batch.response_len == plan.workload.max_response_len


def test_two_waves_in_flight_halve_the_waves_and_hold_both_caches():
    """`sampling.env_overlap`: each wave at most half a replica's episodes, two of them
    resident (the other wave's caches beside the running one's); one episode a replica is
    refused in one keyed line."""
    one, co, _ = _costs("workload.env_step_s=0.05", "sampling.schedule=static")
    two, overlapped, _ = _costs("workload.env_step_s=0.05", "sampling.env_overlap=true",
                                "sampling.schedule=static")
    b1, b2 = one.batch, two.batch
    assert (b1.waves_in_flight, b2.waves_in_flight) == (1, 2)
    assert b2.slots <= b2.sequences_per_rollout_replica // 2 and b2.rollout_waves >= 2
    # the other wave's caches on top of what one wave of the same size holds
    same, _, _ = _costs("workload.env_step_s=0.05", f"sampling.slots={b2.slots}",
                        "sampling.schedule=static")
    assert b2.rollout_bytes_per_device - same.batch.rollout_bytes_per_device == \
        pytest.approx(b2.slots * b2.kv_bytes_per_sequence) == pytest.approx(
            b2.waiting_cache_bytes)
    assert b1.waiting_cache_bytes == 0
    # the environment's seconds are the same; the step waits for fewer of them
    assert overlapped.env_s == co.env_s > 0
    assert co.host_s - overlapped.host_s == pytest.approx(
        co.env_s - (max(co.env_s - co.rollout_s, 0) + min(co.env_s, co.rollout_s) / 8))
    with pytest.raises(PlanError, match="sampling.env_overlap.*two episodes"):
        compile_plan(compose_config([*TOOLS, "sampling.env_overlap=true",
                                     "sampling.schedule=static",
                                     "workload.prompts_per_step=8", "workload.group_size=2",
                                     "algorithm.optimizer_steps_per_batch=1"]))


def test_refilled_episodes_wait_for_their_own_chain_of_environment_steps():
    """`sampling.schedule=refill` (the default): decode and environments overlap as a
    pipeline's two stages, the step waiting for what the decoding does not cover and one
    turn's share of the rest; each turn is a reply's chunks of launches. Two waves in
    flight are for the static schedule."""
    _, static, static_single = _costs("workload.env_step_s=0.05", "sampling.schedule=static")
    plan, co, single = _costs("workload.env_step_s=0.05")
    assert plan.sampling.schedule == "refill"
    turns = plan.workload.max_turns
    exposed = max(co.env_s - co.rollout_s, 0) + min(co.env_s, co.rollout_s) / turns
    assert co.env_s == static.env_s and exposed < co.env_s
    assert (static.host_s - static.dispatch_s) - (co.host_s - co.dispatch_s) == \
        pytest.approx(static.env_s - exposed)
    per_step = plan.topology.hardware.cost.dispatches_per_step
    chunks = -(-plan.workload.max_response_len // plan.sampling.decode_chunk)
    for refilled, waves in ((co, static), (single, static_single)):
        assert refilled.dispatch_s / waves.dispatch_s == pytest.approx(
            (per_step - 1 + turns * chunks) / (per_step + turns - 1))
    with pytest.raises(PlanError, match="sampling.env_overlap=true: two waves in flight are"):
        _costs("sampling.env_overlap=true")

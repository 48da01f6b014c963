"""Cost-model properties over generated configs and layouts (hypothesis)."""

import dataclasses

import hypothesis_profiles  # noqa: F401  (loads the profile named by HYPOTHESIS_PROFILE)
import pytest
from compiler_cases import entry, make_config
from hypothesis import assume, event, given
from hypothesis import strategies as st

from compiler.cost.estimate import CostLayout, estimate

HARDWARE = ["v7x", "v5p", "h100", "cpu"]
MODELS = ["tiny", "tiny", "qwen3_0_6b", "qwen3_1_7b", "qwen3_8b"]
MODES = ("co", "da", "single")


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclasses.dataclass(frozen=True)
class Setup:
    """A config and the per-host shape its layouts use."""

    cfg: object
    per_host: int
    chips_per_host: int
    fsdp: int
    tp: int

    def layout(self, hosts, rollout=None, trainer=None, rounds=(), link="dcn"):
        """CO on `hosts` hosts, or DA when `rollout` and `trainer` split them."""
        trainers = hosts if trainer is None else trainer
        return CostLayout(
            hosts=hosts, devices_per_host=self.per_host, chips=hosts * self.chips_per_host,
            rollout_hosts=hosts if rollout is None else rollout, trainer_hosts=trainers,
            fsdp_devices=self.fsdp, data_replicas=trainers * self.per_host // self.fsdp,
            rollout_tensor_parallel=self.tp, transfer_round_bytes=tuple(rounds),
            transfer_link="none" if rollout is None else link)


@st.composite
def setups(draw, placement=None):
    hw_name = draw(st.sampled_from(HARDWARE))
    hw = entry("hardware", hw_name)
    if hw.chips_per_host:
        per_host, chips_per_host = hw.chips_per_host * hw.devices_per_chip, hw.chips_per_host
    else:
        per_host = chips_per_host = draw(st.sampled_from([1, 2, 4, 8]))
    workload = {"prompts_per_step": draw(st.integers(1, 64)),
                "group_size": draw(st.integers(1, 8)),
                "max_prompt_len": draw(st.integers(8, 512)),
                "max_response_len": draw(st.integers(8, 1024))}
    algorithm = {"optimizer_steps_per_batch": draw(st.integers(1, 4)),
                 "kl_coef": draw(st.sampled_from([0.0, 0.01]))}
    cfg = make_config(model=draw(st.sampled_from(MODELS)), workload="gsm8k", hardware=hw_name,
                      placement=placement,
                      overrides={"workload": workload, "algorithm": algorithm})
    return Setup(cfg, per_host, chips_per_host, fsdp=draw(st.sampled_from(_divisors(per_host))),
                 tp=draw(st.sampled_from(_divisors(per_host))))


def _feasible(cost):
    out = [(mode, getattr(cost, mode)) for mode in MODES if getattr(cost, mode).feasible]
    event(f"feasible modes: {len(out)}")
    return out


@given(setups(), st.integers(1, 8), st.integers(0, 8))
def test_more_chips_never_increase_a_phase_compute_time(s, hosts, extra):
    small, large = estimate(s.cfg, s.layout(hosts)), estimate(s.cfg, s.layout(hosts + extra))
    for mode, before in _feasible(small):
        after = getattr(large, mode)
        if after.feasible:
            assert after.rollout_s <= before.rollout_s * (1 + 1e-12)
            assert after.train_s <= before.train_s * (1 + 1e-12)


@given(setups(placement={"mode": "disaggregated", "rollout_fraction": 0.5}),
       st.integers(1, 4), st.integers(1, 4), st.integers(0, 4), st.integers(0, 4))
def test_more_hosts_in_a_da_role_never_slow_its_phase(s, r, t, more_r, more_t):
    before = estimate(s.cfg, s.layout(r + t, rollout=r, trainer=t, rounds=(1e8,))).da
    after = estimate(s.cfg, s.layout(r + t + more_r + more_t, rollout=r + more_r,
                                     trainer=t + more_t, rounds=(1e8,))).da
    assume(before.feasible and after.feasible)
    assert after.rollout_s <= before.rollout_s * (1 + 1e-12)
    assert after.train_s <= before.train_s * (1 + 1e-12)


@given(setups(placement={"mode": "disaggregated", "rollout_fraction": 0.5}),
       st.lists(st.floats(0, 1e11), min_size=1, max_size=6),
       st.lists(st.floats(1, 10), min_size=6, max_size=6),
       st.lists(st.floats(0, 1e11), max_size=3), st.sampled_from(["ici", "dcn"]))
def test_more_bytes_never_decrease_transfer_time(s, rounds, growth, added, link):
    bigger = [b * g for b, g in zip(rounds, growth, strict=False)] + added
    before = estimate(s.cfg, s.layout(4, rollout=2, trainer=2, rounds=rounds, link=link)).da
    after = estimate(s.cfg, s.layout(4, rollout=2, trainer=2, rounds=bigger, link=link)).da
    assume(before.feasible)
    assert after.transfer_s >= before.transfer_s


@given(setups())
def test_co_on_one_host_differs_from_the_single_controller_only_in_its_launches(s):
    cost = estimate(s.cfg, s.layout(1))
    c = s.cfg.hardware.cost
    assert cost.co.feasible == cost.single.feasible
    assume(cost.co.feasible)
    # Same devices, same host work on the same cores, nothing gathered across hosts; the
    # driver reaches its one worker by remote calls where a local controller launches itself.
    assert cost.single.dispatch_s == pytest.approx(c.dispatches_per_step * c.dispatch_s)
    launches = cost.single.dispatch_s - cost.co.dispatch_s
    assert cost.single.step_s == pytest.approx(cost.co.step_s + launches, rel=1e-9)
    same = ("rollout_s", "train_s", "reward_s", "batch_s", "network_s", "transfer_s",
            "gather_s")
    assert [getattr(cost.co, k) for k in same] == [getattr(cost.single, k) for k in same]


@given(setups(placement={"mode": "disaggregated", "rollout_fraction": 0.5}),
       st.integers(1, 8), st.booleans())
def test_shares_sum_to_one_and_parts_to_the_step(s, hosts, split):
    lay = s.layout(hosts + 1, rollout=1, trainer=hosts, rounds=(5e8,)) if split else \
        s.layout(hosts)
    for _, mode in _feasible(estimate(s.cfg, lay)):
        shares = (mode.compute_share, mode.host_share, mode.network_share, mode.transfer_share)
        assert mode.compute_share + mode.host_share + mode.network_share \
            + mode.transfer_share == 1.0
        assert all(-1e-12 <= x <= 1 + 1e-12 for x in shares)
        parts = mode.compute_s + mode.host_s + mode.network_s + mode.exposed_transfer_s
        assert abs(parts - mode.step_s) <= 1e-9 * mode.step_s
        assert min(mode.rollout_s, mode.train_s, mode.reward_s, mode.transfer_s) >= 0


@given(setups(placement={"mode": "disaggregated", "rollout_fraction": 0.5}),
       st.integers(1, 4), st.integers(1, 4), st.integers(1, 3))
def test_da_with_staleness_is_never_slower_than_synchronous(s, r, t, staleness):
    lay = s.layout(r + t, rollout=r, trainer=t, rounds=(2e8, 2e8))

    def da(stale):
        placement = dataclasses.replace(s.cfg.placement, max_staleness=stale)
        return estimate(dataclasses.replace(s.cfg, placement=placement), lay).da

    sync, overlapped = da(0), da(staleness)
    assume(sync.feasible)
    assert overlapped.step_s <= sync.step_s


@given(setups(), st.integers(1, 16))
def test_the_single_controller_is_never_faster_than_co(s, hosts):
    cost = estimate(s.cfg, s.layout(hosts))
    assume(cost.co.feasible)
    assert cost.single.step_s >= cost.co.step_s

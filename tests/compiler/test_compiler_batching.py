"""Batching and schedule passes: prompt ranges, train batch split, phases per mode."""

import dataclasses

import pytest
from compiler_cases import make_config

from compiler import PlanError, compile_plan
from compiler.plan import Phase, Role

DA = {"mode": "disaggregated", "rollout_fraction": 0.75, "max_staleness": 1}


def test_prompt_ranges_split_the_step_over_rollout_hosts():
    plan = compile_plan(make_config(mesh={"kind": "cpu", "hosts": 4, "devices_per_host": 2},
                               placement=DA))
    b = plan.batch
    assert b.prompts_per_rollout_host == 8
    assert [(r.host, r.start, r.stop) for r in b.prompt_ranges] == [(0, 0, 8), (1, 8, 16),
                                                                    (2, 16, 24)]
    assert b.sequences_per_step == 24 * 8
    assert b.rows_per_trainer_device == 24 * 8 // 2
    assert b.seq_len == 16 + 12


def test_prompts_must_divide_over_rollout_hosts():
    cfg = make_config(mesh={"kind": "cpu", "hosts": 5, "devices_per_host": 1})
    with pytest.raises(PlanError) as err:
        compile_plan(cfg)
    assert err.value.key == "workload.prompts_per_step" and err.value.value == 24
    assert err.value.rule_id == "prompts_divide_hosts"


def test_rows_must_divide_over_trainer_devices():
    cfg = make_config(mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 8},
                      overrides={"workload": {"prompts_per_step": 3, "group_size": 2}})
    with pytest.raises(PlanError) as err:
        compile_plan(cfg)
    assert err.value.rule_id in ("rows_divide_devices", "sequences_divide_replicas")
    assert err.value.key == "workload.prompts_per_step"


def test_warm_up_rows_must_divide_over_trainer_devices():
    # 6 prompts x 8 completions = 48 sequences divide over 16 devices; the warm-up's 6 rows not
    mesh = {"kind": "cpu", "hosts": 2, "devices_per_host": 8}
    workload = {"prompts_per_step": 6, "group_size": 8}
    assert compile_plan(make_config(mesh=mesh, overrides={"workload": workload}))
    cfg = make_config(mesh=mesh, overrides={"workload": workload,
                                            "algorithm": {"sft_warmup_steps": 3}})
    with pytest.raises(PlanError) as err:
        compile_plan(cfg)
    assert (err.value.key, err.value.value) == ("workload.prompts_per_step", 6)
    assert err.value.rule_id == "sft_rows_divide_devices"
    assert "16 trainer devices" in str(err.value)


def test_mini_batches_must_divide_rows():
    cfg = make_config(mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 1},
                      overrides={"workload": {"prompts_per_step": 3, "group_size": 3},
                                 "algorithm": {"optimizer_steps_per_batch": 2}})
    with pytest.raises(PlanError) as err:
        compile_plan(cfg)
    assert err.value.key == "algorithm.optimizer_steps_per_batch"


def test_micro_batches_grow_with_long_sequences():
    short = compile_plan(make_config(model="qwen3_8b", workload="gsm8k", hardware="v7x",
                                mesh={"kind": "tpu", "chips": 8}))
    long = compile_plan(make_config(model="qwen3_8b", workload="numina_cot", hardware="v7x",
                               mesh={"kind": "tpu", "chips": 8},
                               overrides={"workload": {"max_response_len": 8192}}))
    assert long.batch.micro_batches > short.batch.micro_batches
    for plan in (short, long):
        b = plan.batch
        assert b.micro_batches * b.rows_per_micro_batch * b.optimizer_steps == \
            b.rows_per_trainer_device
        budget = plan.topology.device_memory_bytes - plan.sharding.train.bytes_per_device
        assert b.rows_per_micro_batch * b.activation_bytes_per_row <= budget


def test_sequence_longer_than_the_model_is_rejected():
    cfg = make_config(overrides={"workload": {"max_response_len": 50000}},
                      mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 1})
    with pytest.raises(PlanError) as err:
        compile_plan(cfg)
    assert err.value.rule_id == "sequence_length"


def test_sampling_max_new_tokens_sets_the_response_length():
    cfg = make_config(mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 1},
                      overrides={"sampling": {"max_new_tokens": 5}})
    assert compile_plan(cfg).batch.response_len == 5


def test_schedules_per_mode():
    cpu = {"kind": "cpu", "hosts": 4, "devices_per_host": 2}
    co = compile_plan(make_config(mesh=cpu)).schedule
    assert [p.phase for p in co.phases] == list(Phase)
    assert not co.overlaps
    da = compile_plan(make_config(mesh=cpu, placement=DA)).schedule
    assert {(o.ahead, o.behind, o.steps_ahead) for o in da.overlaps} >= {
        (Phase.rollout, Phase.train, 1)}
    assert da.phases[0].where == Role.rollout_hosts and da.phases[3].where == Role.trainer_hosts
    sync = compile_plan(make_config(mesh=cpu, placement={**DA, "max_staleness": 0})).schedule
    assert not sync.overlaps
    single = compile_plan(make_config(mesh=cpu, controller="single")).schedule
    assert single.phases[1].where == Role.controller


def _qwen06(hbm: float, **workload) -> object:
    cfg = make_config(model="qwen3_0_6b", workload="gsm8k",
                      mesh={"kind": "cpu", "hosts": 1, "devices_per_host": 1},
                      overrides={"workload": {"prompts_per_step": 4, "group_size": 4, **workload},
                                 "model": {"num_layers": 2, "dtype": "float32"}})
    return dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, hbm_bytes=hbm))


def test_micro_batches_are_the_fewest_whose_step_fits():
    roomy, tight = compile_plan(_qwen06(2.4e10)), compile_plan(_qwen06(5.2e9))
    assert roomy.batch.micro_batches == 1 and tight.batch.micro_batches == 4
    for plan in (roomy, tight):
        b = plan.batch
        assert b.train_step_bytes_per_device <= 0.9 * plan.topology.device_memory_bytes
        assert b.micro_batches * b.rows_per_micro_batch == b.rows_per_trainer_device
    # One micro-batch fewer would not fit the tight device.
    assert roomy.batch.train_step_bytes_per_device > 0.9 * 5.2e9
    # The kept softmax (T x V per row) only where it fits.
    assert roomy.batch.keep_head_probs and not tight.batch.keep_head_probs


def test_a_step_that_does_not_fit_with_one_row_names_the_length():
    with pytest.raises(PlanError) as err:
        compile_plan(_qwen06(5.2e9, max_response_len=8192))
    e = err.value
    assert (e.key, e.rule_id) == ("workload.max_response_len", "activation_memory")
    assert "8448-token row" in str(e) and "5.2e+09 B device" in str(e)


ROOMY_SFT, TIGHT_SFT = 1.2e10, 7e9
"""Devices whose warm-up step of 16 rows takes one chunk, and two."""


def test_warm_up_micro_batches_follow_the_train_step_rule():
    # 16 prompts: the warm-up's step trains 16 rows (one per prompt), RL's 64 (x G = 4).
    def plan(hbm, warm_up=3):
        cfg = _qwen06(hbm, prompts_per_step=16)
        return compile_plan(dataclasses.replace(cfg, algorithm=dataclasses.replace(
            cfg.algorithm, sft_warmup_steps=warm_up)))

    roomy, tight = plan(ROOMY_SFT), plan(TIGHT_SFT)
    assert roomy.batch.sft_micro_batches == 1 and tight.batch.sft_micro_batches == 2
    for p in (roomy, tight):
        b = p.batch
        assert b.sft_rows_per_trainer_device == 16
        assert b.sft_rows_per_trainer_device % b.sft_micro_batches == 0
        assert b.sft_step_bytes_per_device <= 0.9 * p.topology.device_memory_bytes
        # Fewer rows and no behaviour log-probs: never more chunks than RL's step.
        assert b.sft_micro_batches <= b.micro_batches
    # The fewest that fit: the roomy plan's one chunk does not fit the tight device.
    assert roomy.batch.sft_step_bytes_per_device > 0.9 * TIGHT_SFT
    none = plan(ROOMY_SFT, warm_up=0).batch
    assert (none.sft_rows_per_trainer_device, none.sft_micro_batches,
            none.sft_step_bytes_per_device) == (0, 0, 0.0)


def test_prompt_store_holds_every_prompt_unless_asked_or_crowded():
    one = {"kind": "cpu", "hosts": 1, "devices_per_host": 1}
    whole = compile_plan(make_config(mesh=one)).batch
    assert (whole.prompt_store_rows, whole.prompt_store_refills) == (24, 0)
    asked = compile_plan(make_config(mesh=one, overrides={"sampling": {"prompt_store": 4}})).batch
    assert (asked.prompt_store_rows, asked.prompt_store_refills) == (4, 5)
    # The store's 20 fewer prompts of KV (16 prompt tokens each) is all that changes.
    prompt_kv = whole.kv_bytes_per_sequence * 16 / whole.seq_len
    assert whole.rollout_bytes_per_device - asked.rollout_bytes_per_device == pytest.approx(
        20 * prompt_kv)
    with pytest.raises(PlanError) as err:
        compile_plan(make_config(mesh=one, overrides={"sampling": {"prompt_store": 5}}))
    assert (err.value.key, err.value.rule_id) == ("sampling.prompt_store", "prompt_store_divides")
    assert "the 24 prompts of a rollout replica" in str(err.value)


def test_a_crowded_store_shrinks_to_leave_the_slots():
    """Llama-3 405B's rollout on 64 v7x chips: every prompt's KV would leave no slot; the
    largest divisor of the 384 prompts that leaves half a one-prompt store's slots."""
    cfg = make_config(model="llama3_405b", workload="gsm8k", hardware="v7x",
                      mesh={"kind": "tpu", "chips": 64}, controller="single")
    b = compile_plan(cfg).batch
    assert b.sequences_per_rollout_replica // b.group_size == 384
    assert (b.prompt_store_rows, b.prompt_store_refills, b.slots) == (96, 3, 27)
    with pytest.raises(PlanError) as err:
        compile_plan(dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling,
                                                                      prompt_store=384)))
    assert err.value.rule_id == "rollout_memory" and "(384 prompts)" in str(err.value)

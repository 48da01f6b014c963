"""First pass: every config field's stated range, checked before anything else reads it.

`FIELD_RULES` maps a dotted config key to the rules its value must meet; each rule's `text`
is what the field's docstring in `compiler.config` states (a test checks the docstring holds
it); the rules' kinds are `compiler.rules`. Every float field, listed or not, must also be finite. A new int or float field gets
its rule here in one line (a test fails for one without): a bound (`Bound(lo=1)`: >= 1), a
set (`OneOf`), `Finite` (an optional float without a bound), or a relation to other
fields (`AtLeast`, `Check`).

    finite (every float)  ->  each field's own rules  ->  relations between fields

`range_errors(cfg)` lists one `PlanError` per violated rule (key, value, the rule with its
numbers), in that order; `ranges(cfg)` raises the first, so an out-of-range value is one
line from `locojax.plan` exactly as from a run.
"""

from __future__ import annotations

import math
from typing import Any

from compiler.config import Config, DType, RewardKind, TokenizerKind
from compiler.errors import PlanError, config_fields, value_at
from compiler.families import FAMILIES
from compiler.model_entry import TOKENIZER_IDS
from compiler.rules import (
    RELATIONS,
    AtLeast,
    Bound,
    Chars,
    Check,
    Even,
    Finite,
    FormatFields,
    OneOf,
    Rule,
    Subset,
)
from compiler.sections import LORA_TARGETS
from compiler.vocab import DUAL_CLIP_LOSSES, EnvHub, PolicyLoss


def _has_nope_layers(family) -> bool:
    """Whether `family`'s record computes layers without RoPE (`Family.nope_layers`)."""
    return family in FAMILIES and FAMILIES[family].nope_layers


ARITH_OPS = "+-*"
MIN_ARITH_PROBLEMS = 5
"""Distinct arithmetic problems the generator needs (a fifth are held out for evaluation)."""


def arith_space(cfg: Config) -> float:
    """How many distinct questions `workload.arith` can produce (as `locojax.data.arith`),
    through logarithms so a huge `terms` costs nothing; capped near 1e300."""
    a = cfg.workload.arith
    values, ops = a.max_operand - a.min_operand + 1, len(set(a.ops))
    if values < 1 or ops < 1:
        return 0.0
    log_space = a.terms * math.log(values) + (a.terms - 1) * math.log(ops)
    if log_space < 60:  # exact where it is small enough to matter
        return float(values ** a.terms * ops ** (a.terms - 1))
    return math.exp(min(log_space, 690.0))


def _vocab_ok(vocab: int, cfg: Config) -> bool:
    return vocab >= TOKENIZER_IDS.get(cfg.model.tokenizer, 1)


def _numbers_vocab(cfg: Config) -> str:
    kind = cfg.model.tokenizer
    return f"model.tokenizer={kind} has {TOKENIZER_IDS.get(kind, 1)} ids"


def _numbers_arith(cfg: Config) -> str:
    a = cfg.workload.arith
    return (f"operands {a.min_operand}..{a.max_operand}, {a.terms} terms, ops {a.ops!r}: "
            f"{arith_space(cfg):.0f} problems")


def _compute_peak(dtype: DType) -> Check:
    """The peak FLOP/s of the model's compute dtype is > 0 (the cost model divides by it)."""
    return Check(f"> 0 when model.dtype is {dtype}",
                 lambda peak, cfg: peak > 0 or cfg.model.dtype != dtype,
                 lambda cfg: f"model.dtype={cfg.model.dtype}", ("model.dtype",))


def _user_reward(value: Any, cfg: Config) -> bool:
    """None, or set with `workload.reward=python` (the built-in kinds judge correctness)."""
    return value is None or cfg.workload.reward == RewardKind.python


def _correct_ok(name: str | None, cfg: Config) -> bool:
    return _user_reward(name, cfg) and (name is None or name in cfg.workload.reward_fns)


def _numbers_reward(cfg: Config) -> str:
    names = ", ".join(cfg.workload.reward_fns) or "none"
    return f"workload.reward={cfg.workload.reward}, workload.reward_fns: {names}"


def _address_ok(address: str) -> bool:
    """host:port with a non-empty host and a port in [1, 65535]."""
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


AT_LEAST_1 = Bound(lo=1)
AT_LEAST_0 = Bound(lo=0)
POSITIVE = Bound(lo=0, lo_open=True)
FRACTION = Bound(lo=0, hi=1, lo_open=True)
"""A share or efficiency: in (0, 1]."""
DECAY = Bound(lo=0, hi=1, hi_open=True)
USER_CODE_LIMIT = Bound(lo=0, hi=86_400, lo_open=True)
"""A time limit on the user's code: positive, at most a day (a larger one overflows the
socket wait it becomes)."""

FIELD_RULES: dict[str, tuple[Rule, ...]] = {
    "model.num_layers": (AT_LEAST_1,),
    "model.hidden": (AT_LEAST_1,),
    "model.num_heads": (AT_LEAST_1,),
    "model.num_kv_heads": (AT_LEAST_1,),
    "model.head_dim": (Bound(lo=2), Even()),
    "model.ffn": (AT_LEAST_1,),
    "model.vocab": (AT_LEAST_1, Check(">= the ids of model.tokenizer", _vocab_ok,
                                      _numbers_vocab, ("model.tokenizer",))),
    "model.rope_theta": (POSITIVE,),
    "model.norm_eps": (POSITIVE,),
    "model.max_position": (AT_LEAST_1,),
    "model.sliding_window": (AT_LEAST_0, Check(
        ">= 1 when model.sliding_pattern > 0",
        lambda v, cfg: v >= 1 or cfg.model.sliding_pattern == 0,
        lambda cfg: f"model.sliding_pattern={cfg.model.sliding_pattern}",
        ("model.sliding_pattern",))),
    "model.sliding_pattern": (AT_LEAST_0,),
    "model.rope_local_theta": (AT_LEAST_0, Check(
        "> 0 when model.sliding_pattern > 0",
        lambda v, cfg: v > 0 or cfg.model.sliding_pattern == 0,
        lambda cfg: f"model.sliding_pattern={cfg.model.sliding_pattern}",
        ("model.sliding_pattern",))),
    "model.query_pre_attn_scalar": (AT_LEAST_0,),
    "model.nope_interval": (AT_LEAST_0, Check(
        "0 unless model.family has NoPE layers (smollm3)",
        lambda v, cfg: v == 0 or _has_nope_layers(cfg.model.family),
        lambda cfg: f"model.family={cfg.model.family}", ("model.family",))),
    "model.rope_scaling.factor": (AT_LEAST_1,),
    "model.rope_scaling.original_max_position": (AT_LEAST_0, Check(
        ">= 1 when model.rope_scaling.kind is llama3 or yarn",
        lambda v, cfg: v >= 1 or cfg.model.rope_scaling.kind not in ("llama3", "yarn"),
        lambda cfg: f"model.rope_scaling.kind={cfg.model.rope_scaling.kind}",
        ("model.rope_scaling.kind",))),
    "model.rope_scaling.low_freq_factor": (POSITIVE,),
    "model.rope_scaling.high_freq_factor": (POSITIVE, Check(
        "> model.rope_scaling.low_freq_factor",
        lambda v, cfg: v > cfg.model.rope_scaling.low_freq_factor,
        lambda cfg: f"model.rope_scaling.low_freq_factor={cfg.model.rope_scaling.low_freq_factor}",
        ("model.rope_scaling.low_freq_factor",))),
    "model.rope_scaling.beta_slow": (POSITIVE,),
    "model.rope_scaling.attention_factor": (Check(
        "None or > 0", lambda v, cfg: v is None or v > 0, lambda cfg: "null: 0.1 ln(factor) + 1"),),
    "model.rope_scaling.beta_fast": (POSITIVE, Check(
        "> model.rope_scaling.beta_slow", lambda v, cfg: v > cfg.model.rope_scaling.beta_slow,
        lambda cfg: f"model.rope_scaling.beta_slow={cfg.model.rope_scaling.beta_slow}",
        ("model.rope_scaling.beta_slow",))),
    "workload.arith.min_operand": (AT_LEAST_0,),
    "workload.arith.max_operand": (
        AtLeast("workload.arith.min_operand"),
        Check(f"enough for >= {MIN_ARITH_PROBLEMS} distinct problems",
              lambda _, cfg: arith_space(cfg) >= MIN_ARITH_PROBLEMS, _numbers_arith,
              ("workload.arith.min_operand", "workload.arith.terms", "workload.arith.ops"))),
    "workload.arith.terms": (AT_LEAST_1,),
    "workload.arith.ops": (Chars(ARITH_OPS),),
    "workload.arith.train_size": (AT_LEAST_1,),
    "workload.arith.eval_size": (AT_LEAST_1,),
    "workload.reasoning_gym.task": (Check(
        "empty unless workload.reward=python (the task's score_answer is a reward function)",
        lambda v, cfg: not v or cfg.workload.reward == RewardKind.python,
        lambda cfg: f"workload.reward={cfg.workload.reward}", ("workload.reward",)),),
    "workload.reasoning_gym.size": (AT_LEAST_1,),
    "workload.reasoning_gym.eval_size": (AT_LEAST_1,),
    "workload.reasoning_gym.seed": (AT_LEAST_0,),
    "workload.prompt_template": (FormatFields(("question",)),),
    "workload.format_reward": (Bound(lo=0, hi=1),),
    "workload.eval_fraction": (DECAY,),
    "workload.max_row_bytes": (AT_LEAST_1,),
    "workload.reward_timeout_s": (USER_CODE_LIMIT,),
    "workload.reward_max_fail_steps": (AT_LEAST_1,),
    "workload.reward_fns": (Check(
        "empty unless workload.reward=python (a built-in reward kind scores alone)",
        lambda v, cfg: not v or cfg.workload.reward == RewardKind.python,
        lambda cfg: f"workload.reward={cfg.workload.reward}", ("workload.reward",)),),
    "workload.chat_template": (Check(
        "false with model.tokenizer=char or ascii (they have no chat tokens; episodes of "
        "several turns take the plain turn format)",
        lambda v, cfg: not v or cfg.model.tokenizer not in (TokenizerKind.char,
                                                            TokenizerKind.ascii),
        lambda cfg: f"model.tokenizer={cfg.model.tokenizer}", ("model.tokenizer",)),),
    "workload.reward_memory_mb": (Bound(lo=0, hi=1 << 24), Check(
        "0 (no limit) or >= 256 (a Python worker's own start takes ~150)",
        lambda v, cfg: v == 0 or v >= 256, lambda cfg: "MiB")),
    "workload.correct": (Check(
        "None, or a name in workload.reward_fns with workload.reward=python", _correct_ok,
        _numbers_reward, ("workload.reward", "workload.reward_fns")),),
    "workload.correct_threshold": (Finite(), Check(
        "None unless workload.reward=python", _user_reward,
        lambda cfg: f"workload.reward={cfg.workload.reward}", ("workload.reward",))),
    "workload.prompts_per_step": (AT_LEAST_1,),
    "workload.group_size": (Bound(lo=2),),
    "workload.max_prompt_len": (AT_LEAST_1,),
    "workload.max_response_len": (AT_LEAST_1,),
    "workload.eval_prompts": (AT_LEAST_1,),
    "workload.max_turns": (AT_LEAST_1, Check(
        ">= 2 when workload.tools is set (a tool's result is read in the turn after its call)",
        lambda turns, cfg: turns >= 2 or not cfg.workload.tools,
        lambda cfg: f"workload.tools={sorted(cfg.workload.tools)}", ("workload.tools",))),
    "workload.max_episode_len": (AT_LEAST_0,),
    "workload.env_args": (Check(
        "empty unless workload.env names a hub (" + ", ".join(f"{h}:..." for h in EnvHub) + ")",
        lambda v, cfg: not v or cfg.workload.env.partition(":")[0] in set(EnvHub),
        lambda cfg: f"workload.env={cfg.workload.env!r}", ("workload.env",)),),
    "workload.env_timeout_s": (USER_CODE_LIMIT,),
    "workload.tool_timeout_s": (USER_CODE_LIMIT,),
    "workload.max_tool_calls": (AT_LEAST_1,),
    "workload.max_tool_result_tokens": (AT_LEAST_1,),
    "workload.env_step_s": (AT_LEAST_0,),
    "hardware.platform": (OneOf(("cpu", "tpu", "gpu")),),
    "hardware.peak_flops_bf16": (AT_LEAST_0, _compute_peak(DType.bfloat16)),
    "hardware.peak_flops_fp8": (AT_LEAST_0,),
    "hardware.peak_flops_fp32": (AT_LEAST_0, _compute_peak(DType.float32)),
    "hardware.hbm_bytes": (POSITIVE,),
    "hardware.hbm_bytes_per_s": (POSITIVE,),
    "hardware.ici_bytes_per_s": (POSITIVE,),
    "hardware.dcn_bytes_per_s": (POSITIVE,),
    "hardware.chips_per_host": (AT_LEAST_0,),
    "hardware.devices_per_chip": (AT_LEAST_1,),
    "hardware.slice_topology": (OneOf(("torus3d", "switched", "none")),),
    "hardware.host_cores": (AT_LEAST_1,),
    "hardware.cost.dispatch_s": (AT_LEAST_0,),
    "hardware.cost.local_dispatch_s": (AT_LEAST_0,),
    "hardware.cost.dispatches_per_step": (AT_LEAST_0,),
    "hardware.cost.dispatch_tree_arity": (Bound(lo=2, also=(0,)),),
    "hardware.cost.decode_efficiency": (FRACTION,),
    "hardware.cost.prefill_efficiency": (FRACTION,),
    "hardware.cost.train_efficiency": (FRACTION,),
    "hardware.cost.detok_s_per_token": (AT_LEAST_0,),
    "hardware.cost.score_gsm8k_s_per_sample": (AT_LEAST_0,),
    "hardware.cost.score_boxed_s_per_sample": (AT_LEAST_0,),
    "hardware.cost.encode_s_per_token": (AT_LEAST_0,),
    "hardware.cost.batch_s_per_token": (AT_LEAST_0,),
    "hardware.cost.decode_layer_s": (AT_LEAST_0,),
    "hardware.cost.train_layer_s": (AT_LEAST_0,),
    "hardware.cost.collective_latency_s": (AT_LEAST_0,),
    "hardware.cost.network_efficiency": (FRACTION,),
    "mesh.chips": (AT_LEAST_0,),
    "mesh.hosts": (AT_LEAST_0,),
    "mesh.devices_per_host": (AT_LEAST_0,),
    "mesh.rollout_tensor_parallel": (AT_LEAST_1,),
    "placement.rollout_fraction": (Bound(lo=0, hi=1),),
    "placement.max_staleness": (AT_LEAST_0,),
    "controller.heartbeat_timeout_s": (AT_LEAST_1,),
    "controller.coordinator_port": (Bound(lo=0, hi=65535),),
    "controller.coordinator": (Check("empty or host:port with a port in [1, 65535]",
                                     lambda v, cfg: not v or _address_ok(v),
                                     lambda cfg: "host 0's address and a free port"),),
    "controller.num_hosts": (AT_LEAST_0,),
    "controller.host_index": (Bound(lo=-1), Check(
        "< controller.num_hosts when that is > 0",
        lambda v, cfg: cfg.controller.num_hosts == 0 or v < cfg.controller.num_hosts,
        lambda cfg: f"controller.num_hosts={cfg.controller.num_hosts}",
        ("controller.num_hosts",))),
    "controller.init_timeout_s": (AT_LEAST_1,),
    "algorithm.name": (OneOf(("grpo",)),),
    "algorithm.learning_rate": (AT_LEAST_0,),
    "algorithm.warmup_steps": (AT_LEAST_0,),
    "algorithm.min_lr_ratio": (Bound(lo=0, hi=1),),
    "algorithm.weight_decay": (AT_LEAST_0,),
    "algorithm.adam_b1": (DECAY,),
    "algorithm.adam_b2": (DECAY,),
    "algorithm.grad_clip": (AT_LEAST_0,),
    "algorithm.clip_eps": (Bound(lo=0, hi=1, lo_open=True, hi_open=True),),
    "algorithm.clip_eps_high": (POSITIVE,),
    "algorithm.kl_coef": (AT_LEAST_0,),
    "algorithm.optimizer_steps_per_batch": (AT_LEAST_1,),
    "algorithm.sft_warmup_steps": (AT_LEAST_0,),
    "algorithm.sft_learning_rate": (POSITIVE,),
    "algorithm.rollout_correction_cap": (POSITIVE,),
    "algorithm.rollout_correction_low": (AT_LEAST_0,),
    "algorithm.rollout_correction_seq_cap": (POSITIVE,),
    "algorithm.rollout_correction_seq_low": (AT_LEAST_0,),
    "algorithm.dual_clip": (Bound(lo=1, lo_open=True, also=(0,)), Check(
        "0 unless algorithm.loss takes a dual clip (ppo_clip)",
        lambda v, cfg: v == 0 or PolicyLoss(cfg.algorithm.loss) in DUAL_CLIP_LOSSES,
        lambda cfg: f"algorithm.loss={cfg.algorithm.loss}", ("algorithm.loss",))),
    "algorithm.lora.rank": (AT_LEAST_0,),
    "algorithm.lora.alpha": (POSITIVE,),
    "algorithm.lora.learning_rate": (AT_LEAST_0,),
    "algorithm.lora.targets": (Subset(LORA_TARGETS),),
    "algorithm.lora.dropout": (Bound(lo=0, hi=0),),
    "algorithm.max_sample_batches": (AT_LEAST_1,),
    "algorithm.overlong": (Check(
        "keep unless the workload's episodes are turns (workload.env or workload.tools)",
        lambda v, cfg: v == "keep" or bool(cfg.workload.env or cfg.workload.tools),
        lambda cfg: "no workload.env and no workload.tools",
        ("workload.env", "workload.tools")),),
    "algorithm.overlong_buffer": (AT_LEAST_0, Check(
        "< the episode's tokens (workload.max_episode_len, when set)",
        lambda v, cfg: not cfg.workload.max_episode_len or v < cfg.workload.max_episode_len,
        lambda cfg: f"workload.max_episode_len={cfg.workload.max_episode_len}",
        ("workload.max_episode_len",))),
    "algorithm.zero_std_share": (Bound(lo=0, hi=1),),
    "sampling.temperature": (AT_LEAST_0,),
    "sampling.top_p": (FRACTION,),
    "sampling.top_k": (AT_LEAST_0,),
    "sampling.max_new_tokens": (AT_LEAST_0,),
    "sampling.slots": (AT_LEAST_0,),
    "sampling.prompt_store": (AT_LEAST_0,),
    "sampling.decode_chunk": (AT_LEAST_1,),
    "sampling.decode_quorum": (Bound(lo=0, hi=1),),
    "run.steps": (AT_LEAST_0, Check(
        ">= 1, or 0 for a warm-up-only run (algorithm.sft_warmup_steps >= 1)",
        lambda steps, cfg: steps >= 1 or cfg.algorithm.sft_warmup_steps >= 1,
        lambda cfg: f"algorithm.sft_warmup_steps={cfg.algorithm.sft_warmup_steps}",
        ("algorithm.sft_warmup_steps",))),
    "run.seed": (Bound(lo=0, hi=2**32 - 1),),
    "run.checkpoint_every": (AT_LEAST_0,),
    "run.eval_every": (AT_LEAST_0,),
    "run.eval_samples": (AT_LEAST_1,),
}
"""Config key -> the rules its value meets, as its docstring in `compiler.config` states."""


def _error(cfg: Config, key: str, value: Any, rule: Rule) -> PlanError:
    kind = ("relation" if isinstance(rule, RELATIONS)
            else "choice" if isinstance(rule, (OneOf, Chars, Subset, FormatFields)) else "bound")
    return PlanError(key, value, f"must be {rule.text}{rule.detail(cfg)}", kind)


def range_errors(cfg: Config) -> list[PlanError]:
    """One `PlanError` per violated rule: non-finite floats, own ranges, then relations."""
    errors = [PlanError(key, value, "must be a finite number", "finite")
              for key, tp in config_fields()
              if tp is float and (value := value_at(cfg, key)) is not None
              and not math.isfinite(value)]
    bad = {e.key for e in errors}
    for relations in (False, True):
        for key, rules in FIELD_RULES.items():
            if key in bad:
                continue
            value = value_at(cfg, key)
            for rule in rules:
                if isinstance(rule, RELATIONS) != relations:
                    continue
                if relations and bad.intersection(rule.reads):
                    continue
                if not rule.holds(value, cfg):
                    errors.append(_error(cfg, key, value, rule))
                    bad.add(key)
                    break
    return errors


def ranges(cfg: Config) -> None:
    """Raise the first `PlanError` of `range_errors(cfg)`, if any."""
    errors = range_errors(cfg)
    if errors:
        raise errors[0]

"""`PlanError` and the registries of config keys and rules it may name.

Every rejected configuration raises `PlanError(key, value, rule, rule_id)`: `key` is a
dotted config path from `KEYS`, `rule_id` one of `RULES`, and `str(error)` is one line,
`<key>=<value>: <rule with the numbers>`. Tests check that every rejection names a
registered key and rule, so a new check must register its rule here.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterator
from functools import cache
from typing import Any, Union, get_args, get_origin, get_type_hints

from compiler.config import Config


def _plain(tp: Any) -> Any:
    """`X` of `X | None`; other types unchanged."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _leaves(cls: type, prefix: str) -> Iterator[tuple[str, Any]]:
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = _plain(hints[f.name])
        if dataclasses.is_dataclass(tp):
            yield from _leaves(tp, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", tp


@cache
def config_fields(cls: type = Config) -> tuple[tuple[str, Any], ...]:
    """(dotted key, type) of every leaf field of the schema, in declaration order."""
    return tuple(_leaves(cls, ""))


def value_at(cfg: Any, key: str) -> Any:
    """The value of the dotted config key `key`."""
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


GROUPS = frozenset(f.name for f in dataclasses.fields(Config))
KEYS: frozenset[str] = frozenset({key for key, _ in config_fields()} | GROUPS)
"""Config keys a `PlanError` may name: every leaf field, and group names standing for the
chosen entry (`model`, `hardware`, `controller`)."""

RULES: dict[str, str] = {
    "positive": "a count or size that must be at least 1",
    "derived": "a mesh field the compiler derives for this mesh kind must be left at 0",
    "platform": "the hardware entry's platform must match the mesh kind (or detected devices)",
    "hardware_spec": "a tpu/gpu hardware entry must state chips_per_host and device memory",
    "tpu_slice": "TPU slices are 3D tori: 4, 8, 16, 32 chips, or AxBxC with every dim a "
    "multiple of 4 (v5e, v6e: 2D tori, 1 or 4 to 256 chips, powers of 2)",
    "tpu_target": "aot=true compiles for a TPU slice that JAX's topology API can describe "
    "(a known TPU generation, a slice shape and hosts of 1, 4 or 8 chips)",
    "tpu_memory": "aot=true: every program must fit one device's HBM as the TPU compiler "
    "counts it",
    "whole_hosts": "chips must fill whole hosts (or be 1, 2 or 4 GPUs of one host)",
    "fraction_range": "placement.rollout_fraction must lie strictly between 0 and 1 for DA",
    "role_without_host": "each DA role (rollout, trainer) needs at least one host",
    "controller_placement": "the single controller supports only colocated placement",
    "stale_uncorrected": "DA samples that may lag the trainer (max_staleness > 0) need the "
    "behaviour weight (algorithm.rollout_correction) when pi_old is recomputed",
    "lora_warmup_da": "a whole-model LoRA warm-up (algorithm.lora.warmup=full) changes the base, "
    "which DA's rollout hosts do not receive",
    "model_shape": "num_heads must be a multiple of num_kv_heads",
    "train_memory": "the training state must fit the trainer devices' memory",
    "rollout_memory": "the rollout weights, the prompt KV store and the slots' KV cache must fit "
                      "a replica",
    "axis_divides_dim": "every sharded dimension must be divisible by its mesh axis size",
    "tensor_layout": "rollout tensor parallelism must divide a host's devices or span whole "
    "hosts that divide the rollout hosts",
    "prompts_divide_hosts": "prompts per step must divide evenly over the rollout hosts",
    "sequences_divide_replicas": "a host's sequences must divide evenly over its rollout "
    "replicas",
    "prompt_store_divides": "sampling.prompt_store must divide the prompts of a rollout replica",
    "rows_divide_devices": "sequences per step must divide evenly over the trainer devices",
    "mini_batches_divide": "each trainer device's rows must divide into the optimizer steps",
    "sft_rows_divide_devices": "the supervised warm-up's prompt rows per step must divide "
                               "evenly over the trainer devices",
    "activation_memory": "one sequence's training activations must fit beside the state",
    "memory_fit": "mesh.chips=0 picks the smallest valid machine whose plan compiles; none up "
    "to the search limit does",
    "sequence_length": "prompt plus response length must not exceed model.max_position",
    "finite": "a float field must be a finite number (no nan, inf)",
    "bound": "a number must lie in the range its field's docstring states",
    "choice": "a string must be one of the values its field's docstring states",
    "relation": "a field must keep the relation to other fields its docstring states",
    "checkpoint_arch": "model.checkpoint must hold a readable Qwen3, Qwen2 or Llama config.json "
    "whose numbers equal the model entry's (model=hf takes them from it)",
    "runtime_family": "a training or sampling run needs a model family the runtime can build "
    "(other families are for plan inspection)",
    "training_sampling": "a training run samples its groups (sampling.temperature > 0); "
    "evaluation and locojax-sample may decode greedily",
}
"""Rule id -> the rule in words; the message of each error adds its numbers."""


class PlanError(ValueError):
    """A configuration the compiler rejects: names the config key, its value and the rule."""

    def __init__(self, key: str, value: object, rule: str, rule_id: str) -> None:
        if key not in KEYS or rule_id not in RULES:
            raise KeyError(f"unregistered PlanError key {key!r} or rule {rule_id!r}")
        self.key, self.value, self.rule, self.rule_id = key, value, rule, rule_id
        super().__init__(f"{key}={value}: {rule}".replace("\n", " "))

    def __reduce__(self):
        """Pickle by constructor arguments (Ray ships errors between processes)."""
        return (PlanError, (self.key, self.value, self.rule, self.rule_id))


class ConfigKeyError(ValueError):
    """A key the schema does not have (Hydra lets `+key=value` add one): one line naming it
    and the keys that exist there."""


class PlanInvariantError(RuntimeError):
    """A compiled plan broke one of its own invariants: a compiler bug, not a user error."""

"""The plan's programs compiled by the TPU compiler (libtpu, compile-only devices, no TPU).

Qwen3-0.6B widths with 2 layers at GSM8K's row shape (256 prompt + 768 response tokens),
16 prompts x 4: the global train step, one host's rollout programs (prefill, slot loop) and
CO's reshard, compiled for `v5e:2x2` (4 devices, 15.75 GiB each) through
`locojax.aot.compile_programs` (tpu7x's: benchmarks/aot.py); the plan's per-device estimate of
each is within 25% of the compiler's peak (the train step: within 25% below, 35% above; see
TRAIN_STEP_HIGH). With LoRA (rank 16) the train step and the merge are within 25% on v5e.
A 2-host slice's global train step compiles. A multi-turn plan's rollout programs (the
episode caches' turn-0 extend and decode loop) are within 25%. (A step the compiler finds
too large: test_aot_cli's one line, with the compiler's bytes.)

Every case compiles in one process (tests/workers/aot_worker.py, once per module): it loads
libtpu, which the rest of the suite never does (JAX_PLATFORMS=cpu).
"""

import json
import os
import subprocess
import sys

import pytest
from paths import ROOT, WORKERS

from compiler import compile_plan
from locojax.config.compose import compose_config

pytestmark = pytest.mark.tpu

V5E_HBM = 16_911_433_728
"""15.75 GiB: a v5e device's HBM as the TPU compiler reports it."""
QWEN_2_LAYERS = ["+experiment=gsm8k_co", "model.num_layers=2", "workload.prompts_per_step=16",
                 "workload.group_size=4", "algorithm.optimizer_steps_per_batch=1"]
"""One update per batch (the recipe takes 2: test_two_updates_per_batch_... compiles that)."""
V5E = ["mesh=v5p", "mesh.chips=4", f"hardware.hbm_bytes={V5E_HBM}"]
"""A v5e:2x2 machine as a plan sees it: 4 chips on one host, one device each."""
ALL = "train_step,rollout_prefill,rollout_slots,reshard"
TRAIN_STEP_HIGH = 1.35
"""The 2-layer train step's bound above: the plan's fixed terms (attention scores, head)
over-count what the TPU compiler keeps by 16-31% (docs/aot.md: why they are not refitted)."""
LORA_TRAIN_STEP_HIGH = 1.7
"""The 2-layer LoRA train step's bound above: measured 0.97 before the head gathered its
weight and the loss's forward kept its rows, 1.64 after (plan 3.51 GiB, compiler 2.14), 1.46
since the plan keeps the head's softmax here (plan 11.63, compiler 8.00): the plan's row
activations are full fine-tuning's, and the compiler keeps less for a frozen base's backward
(docs/lora.md, "Not done"). Over, never under."""
PREFILL_BOUNDS = (0.85, 1.15)
"""The prefill's model (`compiler.cost.prefill`) against the compiler: measured 0.89 on v5e
and 1.05 on tpu7x here (1.06 on both at 28 layers; docs/aot.md)."""


def _compile_cases(cases: dict[str, tuple[str, str, list[str]]]) -> dict[str, dict]:
    """Each case's {"reports": [...]} or {"error": ...}, compiled in one worker process."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
               TPU_ACCELERATOR_TYPE="v5litepod-4", TPU_WORKER_HOSTNAMES="localhost",
               TPU_LOG_DIR=str(ROOT / ".pytest_cache" / "tpu_logs"), XLA_FLAGS="",
               JAX_COMPILATION_CACHE_DIR="")
    argv = []
    for topology, programs, overrides in cases.values():
        argv += ["--case", topology, programs, *overrides]
    out = subprocess.run([sys.executable, str(WORKERS / "aot_worker.py"), *argv[1:]],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])["cases"]
    return dict(zip(cases, results, strict=True))


def _reports(compiled: dict[str, dict], case: str) -> list[dict]:
    result = compiled[case]
    assert "error" not in result, result.get("error")
    return result["reports"]


SMALL_ROWS = ["workload.prompts_per_step=4", "workload.group_size=2",
              "workload.max_prompt_len=64", "workload.max_response_len=64"]
"""A batch of 8 rows of 128 tokens: 13 CPU-s of compile for the tiny model's 2-host train
step where GSM8K's rows take 25."""


TWO_UPDATES = ["algorithm.optimizer_steps_per_batch=2"]
"""The recipe's 2 updates per batch: two mini-batches of 8 rows a device on v5e. The plan keeps
the head's softmax for them, which (before the head gathered its weight) the TPU compiler
computed for every device's rows on every device: 18.25 GiB of temporaries on a 15.75 GiB
device (docs/aot.md). Within 25% either way."""


TOOLS_2_LAYERS = ["+experiment=gsm8k_tools_co", "model.num_layers=2",
                  "workload.prompts_per_step=16", "workload.group_size=4"]
"""gsm8k_tools_co's episodes (384-token opening, 1,024 after it, 256-token replies) at 2
layers: 16 episodes per replica, caches of 1,664 columns."""
CASES = {
    "v5e": ("v5e:2x2", ALL, [*QWEN_2_LAYERS, *V5E, *TWO_UPDATES]),
    "lora": ("v5e:2x2", "train_step,reshard", [*QWEN_2_LAYERS, *V5E, "algorithm.lora.rank=16"]),
    "two_host": ("v5p:2x2x2", "train_step", [*QWEN_2_LAYERS, "model=tiny", "mesh=v5p",
                                             "mesh.chips=8", *SMALL_ROWS]),
    "tools": ("v5e:2x2", "rollout_prefill,rollout_slots", [*TOOLS_2_LAYERS, *V5E]),
}
"""Every case the module compiles, in one worker process."""


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    return _compile_cases(CASES)


def test_plan_memory_within_25_percent_of_the_tpu_compiler(compiled):
    """The programs of one host's plan within 25% of the compiler's peak (one update's train
    step: TRAIN_STEP_HIGH): all four on v5e at the recipe's 2 updates per batch. tpu7x's
    programs (its train step carries the per-generation term of the memory model, the kept
    head's buffers, TpuGeneration.head_kept_copies) are compiled by benchmarks/aot.py's cases
    (`--cases gsm8k-v7x-8`: the rows of docs/aot.md's characterization), not in the suite:
    ~95 s of the 20-minute budget (docs/testing.md)."""
    reports, updates, programs = _reports(compiled, "v5e"), TWO_UPDATES, ALL
    assert [r["name"] for r in reports] == programs.split(",")
    for r in reports:
        assert r["compiler_bytes"] > 0 and r["compile_s"] > 0, r
        # The train step's estimate over-counts at 2 layers (measured 1.16 on v5e, 1.31 on
        # tpu7x with the head's gathered weight; 1.03 on v5e since the plan keeps the head's
        # softmax there: docs/aot.md, "The kept head"); never under 0.75.
        high = TRAIN_STEP_HIGH if r["name"] == "train_step" and not updates else 1.25
        assert 0.75 <= r["ratio"] <= high, (r["name"], r["plan_bytes"], r["compiler_bytes"])
    if programs == ALL:
        prefill = reports[1]
        assert PREFILL_BOUNDS[0] <= prefill["ratio"] <= PREFILL_BOUNDS[1], prefill
    train = reports[0]
    assert {c["kind"] for c in train["collectives"]} >= {"all-gather", "all-reduce"}  # FSDP
    # Counted once per collective (not per async fusion copy: 17.9 GiB of all-gathers), a
    # device receiving 3/4 of each FSDP gather over 4 devices: measured 1.30 GiB, 0.98 received.
    gather = next(c for c in train["collectives"] if c["kind"] == "all-gather")
    assert 0.5 * gather["bytes"] <= gather["received_bytes"] < gather["bytes"] < 4 * 2**30
    # The plan's network bytes (every pass's FSDP gather in bf16, remat's second gather of the
    # blocks, every micro-batch's gradient reduction in fp32, each update) against what a
    # device receives in all: measured 2.70 / 2.80 GiB (the compiler's permutes carry the fp32
    # gradient and windowed gathers).
    _network_near_the_compilers(train)
    # The cost model's FLOPs (the head on the 768 response columns, no remat recompute) are
    # at most the compiler's: measured 0.90 (14.98 / 16.62 TFLOP at 2 and at 1 update).
    assert 0.7 <= train["plan_flops"] / train["flops"] <= 1.0, (train["plan_flops"],
                                                               train["flops"])


def test_lora_train_step_and_merge_within_25_percent_of_the_tpu_compiler(compiled):
    # Rank 16 on all seven block matmuls: the step takes the adapters, their moments, the
    # batch and the frozen bf16 base; CO's reshard is the trainer's merge (base + s A B).
    reports = _reports(compiled, "lora")
    assert [r["name"] for r in reports] == ["train_step", "reshard"]
    for r in reports:
        high = LORA_TRAIN_STEP_HIGH if r["name"] == "train_step" else 1.25
        assert 0.75 <= r["ratio"] <= high, (r["name"], r["plan_bytes"], r["compiler_bytes"])
    # The cost model's FLOPs leave out the frozen base's weight gradients (1.21 of the
    # compiler's when they were counted) and charge the head on the 768 response columns,
    # where the trainer runs it: measured 0.86 (10.19 / 11.86 TFLOP; 1.07 while the head was
    # charged on all 1,024 columns). Never above: remat's recompute is the rest.
    train = reports[0]
    assert 0.7 <= train["plan_flops"] / train["flops"] <= 1.0, (train["plan_flops"],
                                                               train["flops"])
    # No full-model masters or moments among the arguments: about the bf16 base's shard
    # (the adapters, their moments and the batch are small).
    params = compile_plan(compose_config([*QWEN_2_LAYERS, *V5E])).model.param_count
    assert params * 2 / 4 < reports[0]["argument_bytes"] < 1.2 * params * 2 / 4
    # The base's gathers (no gradient scatter) and the adapters' fp32 all-reduce against what a
    # device receives: measured 0.57 / 0.59 GiB.
    _network_near_the_compilers(train)


TWO_HOST_NETWORK_HIGH = 2.1
"""The tiny model's 2-host step: the plan's network bytes over the compiler's, measured 1.97
(0.71 / 0.36 GiB). Its two fp32 V x D tables are 95% of its gradient, and at 2 layers the
compiler reduces them once over the FSDP group (the lookup's) or over the data replicas only
(the head's, each device computing its shard's part whole), where the 28-layer steps
all-reduce both over every device, the head's chunk by chunk, as the plan counts them
(docs/aot.md: every characterization row within 25%). Over, never under."""


def _network_near_the_compilers(train: dict, high: float = 1.25) -> None:
    """The plan's network bytes of a train step within 25% of what a device receives in all
    the compiler's collectives (`compiler.cost.phases.fsdp_bytes` and the rest), or up to
    `high` over it."""
    received = sum(c["received_bytes"] for c in train["collectives"])
    assert 0.75 <= train["plan_network_bytes"] / received <= high, (
        train["plan_network_bytes"], received)


def test_two_host_slice_train_step_compiles(compiled):
    # v5p, 8 chips: 2 hosts of 4 devices (`v5p:2x2x2` spans 2 processes), FSDP x data. The
    # tiny model at a small batch: what is tested is the slice (its figures at Qwen3-0.6B
    # widths are the other tests' and docs/aot.md's characterization).
    (train,) = _reports(compiled, "two_host")
    assert train["devices"] == 8 and train["compiler_bytes"] > 0
    # FSDP gathers and the gradient's all-reduces: TWO_HOST_NETWORK_HIGH.
    _network_near_the_compilers(train, TWO_HOST_NETWORK_HIGH)


def test_multi_turn_rollout_programs_within_25_percent_of_the_tpu_compiler(compiled):
    """The episode caches' programs (`rollout.episodes`): turn 0's extend (measured 0.96:
    plan 0.99 GB, compiler 1.03) and one turn's decode loop (0.91: 0.67 and 0.74 GB)."""
    prefill, slots = _reports(compiled, "tools")
    assert (prefill["name"], slots["name"]) == ("rollout_prefill", "rollout_slots")
    for r in (prefill, slots):
        assert 0.75 <= r["ratio"] <= 1.25, (r["name"], r["plan_bytes"], r["compiler_bytes"])
        # The caches (16 episodes x 1,536 columns x 2 layers x 8 kv heads x 128, K and V,
        # bf16) are an argument of both, updated in place.
        assert r["alias_bytes"] >= 16 * 1536 * 2 * 8 * 128 * 2 * 2, r

"""The one trainer, in process on 8 CPU devices: the KL reference is the warmed-up policy,
kept and restored on resume (never trained again); weights come from an HF checkpoint onto
the training shardings; host copies and the rollout copy cover every element exactly once;
a plan-only family stops a run in one line."""

import dataclasses
import sys

import jax
import numpy as np
import pytest
import warm
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from paths import FIXTURES, ROOT

from compiler import compile_plan
from locojax.config.compose import compose_config
from locojax.model import flat_params, load_hf_checkpoint
from locojax.runtime.components import build_host, rollout_shardings
from locojax.runtime.episode import sft_rows
from locojax.runtime.trainer import Trainer
from locojax.runtime.weights import covers, host_copy, initial_params, rollout_params

FIXTURE = FIXTURES / "tiny_qwen3"
SMALL = ["+experiment=arith_co", "mesh=cpu", "mesh.devices_per_host=8",
         "workload.prompts_per_step=8", "workload.group_size=2", "run.eval_every=0"]
SFT_PROMPTS, SFT_TIGHT_HBM = 32, 5e6
"""32 warm-up rows (4 a device) fit the default CPU device at once, a 5 MB one in 4 chunks."""


@pytest.fixture(autouse=True)
def _eight_devices():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS)")


def _host(*overrides):
    return build_host(compile_plan(compose_config([*SMALL, *overrides])), 0)


def _rows(host, seed: int = 0) -> dict[str, np.ndarray]:
    """GRPO rows of this host's shape: prompt + reference solution, random advantages."""
    problems = host.data.workload.train[:host.plan.batch.sequences_per_step]
    rows = sft_rows(host, list(problems))
    b, length = rows["tokens_BxL"].shape
    rng = np.random.default_rng(seed)
    return {**rows, "advantages_B": rng.standard_normal(b).astype(np.float32),
            "behaviour_logp_BxL": np.full((b, length), -1.0, np.float32)}


def _same(a, b) -> bool:
    """Same tree, same dtypes, bit-identical values (compared in fp32)."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return (jax.tree.structure(a) == jax.tree.structure(b)
            and all(np.asarray(x, np.float32).tobytes() == np.asarray(y, np.float32).tobytes()
                    for x, y in zip(la, lb, strict=True)))


def _fail(*_args):
    raise AssertionError("the warm-up ran again")


def test_reference_is_the_warmed_up_policy_kept_and_restored_never_retrained(tmp_path):
    host = _host("algorithm.kl_coef=0.05", "algorithm.sft_warmup_steps=2", "run.steps=2",
                 "run.checkpoint_every=1")
    first = Trainer(host, tmp_path, host.prompt_range(), primary=True)
    start = first.start(log=lambda _: None)
    assert start.step == 0 and start.sft_loss is not None
    assert start.source == "random init (run.seed=0)"
    assert _same(first.reference, first.params), "the reference is the warmed-up policy"
    warmed = host_copy(first.params, "float32")
    metrics = first.train(0, _rows(host))
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)
    first.checkpoints.wait()
    assert not _same(first.reference, first.params), "training moved the policy"

    resumed = Trainer(host, tmp_path, host.prompt_range(), primary=True)
    resumed.steps = dataclasses.replace(resumed.steps, sft=_fail)
    said = []
    start = resumed.start(log=said.append)
    assert (start.step, start.sft_loss, said) == (1, None, ["resumed from the checkpoint of "
                                                            "step 1"])
    assert _same(resumed.params, first.params) and _same(resumed.opt_state, first.opt_state)
    again = host_copy(resumed.reference, "float32")
    assert all(again[k].tobytes() == warmed[k].tobytes() for k in warmed)
    assert resumed.train(1, _rows(host, seed=1))["kl"] > 0


def test_initial_weights_from_the_checkpoint_sit_on_the_training_shardings():
    host = _host("model=hf", f"model.checkpoint={FIXTURE}", "model.tokenizer=char",
                 "model.dtype=float32")
    params = initial_params(host)
    _, want = load_hf_checkpoint(FIXTURE)
    shardings = flat_params(host.model.param_shardings)
    for name, var in flat_params(params).items():
        assert var[...].sharding == shardings[name].get_value(), name
        assert np.asarray(var[...]).tobytes() == np.asarray(flat_params(want)[name][...]).tobytes()
    assert {len(var[...].addressable_shards) for var in flat_params(params).values()} == {8}


def test_covers_needs_every_element_exactly_once():
    halves = {((0, 2), (0, 4)), ((2, 4), (0, 4))}
    assert covers((4, 4), halves)
    assert not covers((4, 4), {((0, 2), (0, 4))}), "a missing half"
    assert not covers((4, 4), halves | {((1, 3), (0, 4))}), "an overlapping box"
    assert not covers((4, 4), {((0, 2), (0, 4)), ((1, 4), (0, 3))}), "overlap hides a gap"


def test_host_copy_and_rollout_copy_of_sharded_weights():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "fsdp"))
    x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    tree = {"w": jax.device_put(x, NamedSharding(mesh, P("fsdp"))),
            "b": jax.device_put(x[0], NamedSharding(mesh, P()))}
    copy = host_copy(tree, "bfloat16")
    assert copy["w"].dtype == np.dtype(jax.numpy.bfloat16)
    np.testing.assert_array_equal(copy["w"].astype(np.float32), x)
    host = _host()
    params = initial_params(host)  # on the training shardings (FSDP over 8 devices)
    local = rollout_params(host, params)
    # The rollout copy takes the plan's rollout layout (components.rollout_shardings).
    for arr, want, src in zip(jax.tree.leaves(local), jax.tree.leaves(rollout_shardings(
            host, params)), jax.tree.leaves(params), strict=True):
        assert arr.sharding == want
        assert arr.dtype == np.dtype(host.model.compute_dtype)
        np.testing.assert_array_equal(np.asarray(arr), np.asarray(src).astype(arr.dtype))


@pytest.mark.parametrize("module,extra", [("locojax", []), ("locojax.sample", ["prompt=hi"])])
def test_a_plan_only_family_stops_a_run_in_one_line_naming_model_family(module, extra, tmp_path):
    out = warm.run([sys.executable, "-m", module, "model=llama3_70b", *extra,
                    f"hydra.run.dir={tmp_path}"],
                   capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model.family=llama3:"), lines


def test_a_greedy_training_run_stops_in_one_line_and_a_greedy_plan_does_not(tmp_path):
    out = warm.run([sys.executable, "-m", "locojax", "+experiment=arith_co",
                    "sampling.temperature=0", f"hydra.run.dir={tmp_path}"],
                   capture_output=True, text=True, timeout=300, cwd=ROOT)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith("error: sampling.temperature=0.0: must be > 0 for training"), lines
    assert not (tmp_path / "metrics.jsonl").exists()
    from compiler import compile_plan
    from locojax.config.compose import compose_config
    compile_plan(compose_config(["+experiment=arith_co", "sampling.temperature=0"]))


def test_plan_inspection_of_a_plan_only_family_still_works():
    out = warm.run([sys.executable, "-m", "locojax.plan", "model=llama3_70b", "mesh=h100",
                    "mesh.chips=64", "format=json"], capture_output=True, text=True,
                   timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert '"family": "llama3"' in out.stdout


def test_bf16_compute_keeps_fp32_master_and_moments_in_orbax_and_casts_copies(tmp_path):
    """model.dtype=bfloat16: Orbax holds float32 params and AdamW moments (the master); the
    rollout copy and the DA host copy are bf16, and the plan's transfer slices their bytes."""
    import orbax.checkpoint as ocp

    from compiler.params import param_table
    from locojax.disagg.transfer import cut_slice

    host = _host("model.dtype=bfloat16", "algorithm.sft_warmup_steps=0", "run.steps=1",
                 "run.checkpoint_every=1")
    trainer = Trainer(host, tmp_path, host.prompt_range(), primary=True)
    trainer.start(log=lambda _: None)
    trainer.train(0, _rows(host))
    trainer.checkpoints.wait()
    on_disk = {item: ocp.StandardCheckpointer().metadata(tmp_path / "checkpoints" / "1" / item)
               for item in ("params", "opt_state")}
    params = {k: v.dtype for k, v in on_disk["params"].item_metadata.tree.items()}
    opt = on_disk["opt_state"].item_metadata.tree
    moments = {k: v.dtype for k, v in opt.items() if ".mu." in f".{k}." or ".nu." in f".{k}."}
    assert len(params) == len(param_table(host.plan.model.config))
    assert len(moments) == 2 * len(params), sorted(opt)
    assert set(params.values()) == set(moments.values()) == {np.dtype("float32")}
    bf16 = np.dtype(jax.numpy.bfloat16)
    assert {x.dtype for x in jax.tree.leaves(trainer.rollout_weights())} == {bf16}
    flat = trainer.host_copy()  # DA transfer slices: the compute dtype, the plan's bytes
    assert {x.dtype for x in flat.values()} == {bf16}
    da = compile_plan(compose_config(["+experiment=arith_da", "mesh=cpu", "mesh.hosts=3",
                                 "placement.rollout_fraction=0.67", "model.dtype=bfloat16"]))
    for ws in da.transfer.slices:
        assert sum(x.nbytes for x in cut_slice(flat, ws)) == ws.bytes


def test_the_warm_up_step_runs_in_the_plans_micro_batches():
    """The plan's `batch.sft_micro_batches` is the chunk count of the trainer's warm-up
    program (lowered from abstract state: nothing is allocated or compiled). That k chunks
    give one chunk's update: test_train_micro.py::test_sft_micro_batches_give_the_same_update."""
    from locojax.runtime import assemble
    from locojax.runtime.train_programs import abstract_state, global_batch, make_steps
    from locojax.train import SftBatch, make_optimizer

    common = ["algorithm.sft_warmup_steps=1", f"workload.prompts_per_step={SFT_PROMPTS}"]
    roomy = _host(*common)
    tight = _host(*common, f"hardware.hbm_bytes={SFT_TIGHT_HBM}")
    k = tight.plan.batch.sft_micro_batches
    assert roomy.plan.batch.sft_micro_batches == 1 and k == 4
    assert tight.plan.batch.sft_rows_per_trainer_device == SFT_PROMPTS // 8
    no_warm_up = _host("algorithm.sft_warmup_steps=0")
    assert no_warm_up.plan.batch.sft_micro_batches == 0 and make_steps(no_warm_up).sft is None
    problems = list(roomy.data.workload.train[:SFT_PROMPTS])
    texts = []
    for host in (roomy, tight):
        tx = make_optimizer(assemble.sft_optimizer(host.plan.algorithm))
        batch = global_batch(host, sft_rows(host, problems), SftBatch)
        texts.append(make_steps(host).sft.lower(*abstract_state(host, tx), batch).as_text())
    # The tight plan's step stacks the update's rows as k chunks (the accumulation scan's
    # operand); the roomy plan's never does.
    chunked = f"tensor<{k}x{SFT_PROMPTS // k}x{batch.tokens_BxL.shape[1]}xi32>"
    assert chunked in texts[1] and chunked not in texts[0]


def _one_step_moves_only_the_adapters(trainer: Trainer, host) -> None:
    """A LoRA GRPO step from the base (KL 0): the frozen base keeps its bits, some adapter
    B leaves no longer zero; the step's checkpoint written."""
    base = host_copy(trainer.base, "float32")
    assert trainer.train(0, _rows(host))["kl"] == pytest.approx(0.0, abs=1e-6)
    trainer.checkpoints.wait()
    after = host_copy(trainer.base, "float32")
    assert all(after[k].tobytes() == base[k].tobytes() for k in base), "the base is frozen"
    assert any(np.abs(np.asarray(ad["b"])).max() > 0 for ad in trainer.params.values())


def test_lora_trains_adapters_over_the_frozen_hf_base_resumes_and_refuses_another(tmp_path):
    import shutil

    from safetensors.numpy import load_file, save_file

    from locojax.runtime.errors import ResumeRefused

    lora = ["model=hf", "model.tokenizer=char", "model.dtype=float32", "algorithm.lora.rank=4",
            "algorithm.kl_coef=0.05", "run.steps=2", "run.checkpoint_every=1",
            "algorithm.lora.learning_rate=1e-2", "algorithm.sft_warmup_steps=0"]
    host = _host(*lora, f"model.checkpoint={FIXTURE}")
    first = Trainer(host, tmp_path / "run", host.prompt_range(), primary=True)
    first.start(log=lambda _: None)
    assert first.reference is first.base, "the KL reference is the frozen base: no copy"
    _one_step_moves_only_the_adapters(first, host)
    resumed = Trainer(host, tmp_path / "run", host.prompt_range(), primary=True)
    assert resumed.start(log=lambda _: None).step == 1
    assert _same(resumed.params, first.params) and _same(resumed.opt_state, first.opt_state)
    # The same adapters on another base: refused in one line.
    other = tmp_path / "other"
    shutil.copytree(FIXTURE, other)
    tensors = load_file(str(other / "model.safetensors"))
    name = next(k for k in tensors if k.endswith("q_proj.weight"))
    tensors[name] = tensors[name] * 2
    save_file(tensors, str(other / "model.safetensors"))
    moved = _host(*lora, f"model.checkpoint={other}")
    with pytest.raises(ResumeRefused, match="another base"):
        Trainer(moved, tmp_path / "run", moved.prompt_range(), primary=True).start(
            log=lambda _: None)


def test_lora_whole_model_warm_up_is_the_frozen_base_resumed_from_the_run(tmp_path):
    """algorithm.lora.warmup=full: the warm-up trains the whole model exactly as full
    fine-tuning's does; that model is the frozen base and KL reference, step 0's policy;
    a GRPO step moves only the adapters; a resume restores the warmed base from the run
    (never warming up again) and refuses a saved base the adapters were not trained on."""
    import shutil

    from locojax.runtime.adapters import base_params
    from locojax.runtime.errors import ResumeRefused

    common = ["algorithm.sft_warmup_steps=2", "algorithm.kl_coef=0.05", "run.steps=2",
              "run.checkpoint_every=1", "algorithm.learning_rate=1e-2"]
    full = Trainer(_host(*common), tmp_path / "full", (0, 8), primary=True)
    full_start = full.start(log=lambda _: None)
    host = _host(*common, "algorithm.lora.rank=4", "algorithm.lora.warmup=full")
    first = Trainer(host, tmp_path / "run", host.prompt_range(), primary=True)
    start = first.start(log=lambda _: None)
    assert start.sft_loss == full_start.sft_loss, "the same warm-up as full fine-tuning"
    assert _same(first.base, full.reference), "the base is the warmed-up model"
    assert first.reference is first.base
    assert _same(first.policy("float32"), first.base), "step 0's policy is the warmed base"
    _one_step_moves_only_the_adapters(first, host)

    resumed = Trainer(host, tmp_path / "run", host.prompt_range(), primary=True)
    resumed.steps = dataclasses.replace(resumed.steps, sft=_fail)
    assert resumed.start(log=lambda _: None).step == 1
    assert _same(resumed.base, first.base) and _same(resumed.params, first.params)
    # The saved base replaced by the unwarmed one: the adapters' fingerprint refuses it.
    shutil.rmtree(first._reference_dir)
    first._save_frozen(base_params(host))
    again = Trainer(host, tmp_path / "run", host.prompt_range(), primary=True)
    with pytest.raises(ResumeRefused, match="another base"):
        again.start(log=lambda _: None)

"""The jitted train step on a tiny Qwen3: GRPO and SFT updates learn; optimizer pieces."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compiler.vocab import LossAggregation, LrSchedule
from locojax.model import ModelArch, Qwen3, split_params
from locojax.model.qwen3 import flat_params
from locojax.train.batch import SftBatch, TrainBatch
from locojax.train.optimizer import init_opt_state, learning_rate_schedule, make_optimizer
from locojax.train.settings import ForwardSettings, GrpoSettings, OptimizerSettings
from locojax.train.step import make_logprob_fn, make_sft_step, make_train_step, split_minibatches

ARCH = ModelArch(
    num_layers=2, hidden=64, num_heads=4, num_kv_heads=2, head_dim=16, ffn=128, vocab=256,
    rope_theta=10_000.0,
)  # fmt: skip
B, L, PROMPT_END = 16, 12, 5
FWD = ForwardSettings(response_len=L - PROMPT_END, vocab_chunk=128)


@pytest.fixture(scope="module")
def model_params():
    return split_params(Qwen3(ARCH, rngs=nnx.Rngs(0)))


def _layout(seed=0):
    """Left-padded prompts ending at PROMPT_END, ragged responses, right padding."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, ARCH.vocab, (B, L)).astype(np.int32)
    valid = np.zeros((B, L), bool)
    response = np.zeros((B, L), bool)
    positions = np.zeros((B, L), np.int32)
    for b in range(B):
        start = PROMPT_END - int(rng.integers(2, PROMPT_END + 1))
        stop = PROMPT_END + int(rng.integers(2, L - PROMPT_END + 1))
        valid[b, start:stop] = True
        response[b, PROMPT_END:stop] = True
        positions[b, start:stop] = np.arange(stop - start)
    tokens[~valid] = 0
    return jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid), jnp.asarray(response)


def _grpo_batch(graphdef, params, seed=0, ref_noise=0.0):
    """An on-policy batch: behaviour log-probs are the model's own."""
    tokens, positions, valid, response = _layout(seed)
    logp = make_logprob_fn(graphdef, forward=FWD)(params, tokens, positions, valid)
    adv = jnp.asarray(np.random.default_rng(seed + 1).choice([-1.0, 1.0], B), jnp.float32)
    ref = logp + ref_noise * jax.random.normal(jax.random.key(seed), logp.shape)
    return TrainBatch(tokens, positions, valid, response, adv, logp, ref if ref_noise else None)


SETTINGS = GrpoSettings(
    clip_eps=0.2, clip_eps_high=0.28, kl_coef=0.05, aggregation=LossAggregation.sequence_mean,
    max_response_len=7, optimizer_steps_per_batch=2, forward=FWD,
    optimizer=OptimizerSettings(
        learning_rate=1e-3, schedule=LrSchedule.cosine, warmup_steps=1, total_steps=10,
        weight_decay=0.01, grad_clip=1.0,
    ),
)  # fmt: skip


def test_grpo_steps_move_logp_with_advantage_sign(model_params):
    graphdef, params = model_params
    batch = _grpo_batch(graphdef, params, seed=3)
    settings = dataclasses.replace(
        SETTINGS, kl_coef=0.0, optimizer_steps_per_batch=1,
        optimizer=OptimizerSettings(learning_rate=3e-3),
    )  # fmt: skip
    tx = make_optimizer(settings.optimizer)
    step = make_train_step(graphdef, settings)
    logp_fn = make_logprob_fn(graphdef, forward=FWD)
    state = jax.tree.map(jnp.copy, params)  # the step donates its inputs
    opt_state, losses = init_opt_state(tx, params), []
    for _ in range(4):
        state, opt_state, metrics = step(state, opt_state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0] - 0.05, losses
    seq_logp_before = (batch.behaviour_logp_BxL * batch.loss_mask_BxL).sum(1)
    logp_after = logp_fn(state, batch.tokens_BxL, batch.positions_BxL, batch.valid_BxL)
    delta = (logp_after * batch.loss_mask_BxL).sum(1) - seq_logp_before
    positive = batch.advantages_B > 0
    assert (delta[positive] > 0).all() and (delta[~positive] < 0).all(), delta


def test_sft_steps_reduce_cross_entropy(model_params):
    graphdef, params = model_params
    tokens, positions, valid, response = _layout(5)
    batch = SftBatch(tokens, positions, valid, response)
    opt = OptimizerSettings(learning_rate=1e-2, warmup_steps=2, total_steps=6)
    step = make_sft_step(graphdef, opt, forward=ForwardSettings(response_len=L - PROMPT_END, vocab_chunk=64))
    state = jax.tree.map(jnp.copy, params)
    opt_state, losses = init_opt_state(make_optimizer(opt), params), []
    for _ in range(6):
        state, opt_state, metrics = step(state, opt_state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[0] == pytest.approx(np.log(ARCH.vocab), rel=0.1)  # near-uniform at init
    assert losses[-1] < losses[0] - 0.5, losses


def test_minibatches_take_strided_rows():
    x = jnp.arange(8)
    stacked = split_minibatches({"x": x}, 2)["x"]
    np.testing.assert_array_equal(stacked, [[0, 2, 4, 6], [1, 3, 5, 7]])
    with pytest.raises(ValueError, match="mini-batches"):
        split_minibatches({"x": x}, 3)


def test_learning_rate_schedules():
    cos = learning_rate_schedule(
        OptimizerSettings(1.0, LrSchedule.cosine, warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    )
    np.testing.assert_allclose([cos(i) for i in (0, 2, 4, 9, 14, 20)],
                               [0.25, 0.75, 1.0, 0.55, 0.1, 0.1], atol=1e-6)  # fmt: skip
    const = learning_rate_schedule(OptimizerSettings(2.0, warmup_steps=2))
    np.testing.assert_allclose([const(i) for i in (0, 1, 2, 50)], [1.0, 2.0, 2.0, 2.0])


def test_weight_decay_spares_norm_scales(model_params):
    _, params = model_params
    opt = OptimizerSettings(learning_rate=0.1, weight_decay=0.5, grad_clip=0.0)
    tx = make_optimizer(opt)
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
    for name, var in flat_params(updates).items():
        decayed = bool(jnp.any(var[...] != 0))
        assert decayed == ("norm" not in name), name


def test_the_loss_forward_holds_activations_to_the_row_sharding(model_params):
    # Without the constraint the TPU compiler lays the blocks out with every row of the
    # micro-batch on each device (docs/aot.md: 17.97 GiB against 14.37 on v5e, 8 chips).
    graphdef, params = model_params
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    settings = dataclasses.replace(SETTINGS, optimizer_steps_per_batch=1)
    step = make_train_step(graphdef, settings, batch_sharding=rows, donate=False)
    batch = _grpo_batch(graphdef, params, ref_noise=0.1)
    opt_state = init_opt_state(make_optimizer(settings.optimizer), params)
    text = step.lower(params, opt_state, batch).as_text()
    held = [line for line in text.splitlines() if "sharding_constraint" in line
            and f"{B}x{L}x{ARCH.hidden}x" in line and '[{"data"}, {}, {}]' in line]
    assert held, "no B x L x D activation held to the row sharding in the train step"

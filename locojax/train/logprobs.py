"""Token log-probabilities and entropies from final hidden states, in vocabulary chunks.

A plain log-softmax over a 151,936-entry vocabulary materialises N x V logits and made the
forward half of a train step. Here the vocabulary is walked in chunks with a running max and
sum (online logsumexp), and a custom VJP recomputes each chunk's softmax in the backward
pass, so the largest buffer is N x chunk and nothing of size V per token is kept for the
gradient. The result is exact: same maths as `jax.nn.log_softmax`, other summation order.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec, Sharding

DEFAULT_VOCAB_CHUNK = 8192


def _split(w_VxD: jax.Array, chunk: int) -> tuple[jax.Array, jax.Array]:
    """Full chunks stacked as n x C x D (a free reshape) and the tail of V % C rows."""
    v = w_VxD.shape[0]
    chunk = min(chunk, v)
    n = v // chunk
    return w_VxD[: n * chunk].reshape(n, chunk, w_VxD.shape[1]), w_VxD[n * chunk :]


def _gathered(w_CxD: jax.Array, dtype, whole: Sharding | None) -> jax.Array:
    """The output weight (or a chunk of it) in `dtype`, held whole on every device when
    `whole` is given (`head_layout`): FSDP's all-gather of the weight, so each device
    multiplies only its own rows. Left to itself the TPU compiler kept the weight
    hidden-sharded and computed every row's logits on every device (partial sums over the
    hidden dimension, all-reduced: an N x V fp32 buffer the size of the whole mini-batch per
    device; docs/aot.md)."""
    w_CxD = w_CxD.astype(dtype)
    return w_CxD if whole is None else jax.lax.with_sharding_constraint(w_CxD, whole)


def _logits(h_NxD: jax.Array, w_CxD: jax.Array, scale: float,
            whole: Sharding | None = None) -> jax.Array:
    """fp32 logits of one vocabulary chunk, times `scale` (1 / temperature); the weight is
    cast to the hidden states' (compute) dtype (`_gathered`), the products accumulate in
    fp32."""
    z_NxC = jnp.einsum("nd,cd->nc", h_NxD, _gathered(w_CxD, h_NxD.dtype, whole),
                       preferred_element_type=jnp.float32)
    return z_NxC if scale == 1.0 else z_NxC * scale


def _forward(h_NxD, w_VxD, t_N, chunk, scale, whole=None):
    """Target logit minus logsumexp, and entropy, per row."""
    n_rows = h_NxD.shape[0]

    def absorb(carry, w_CxD):
        max_N, sum_N, zsum_N = carry
        z_NxC = _logits(h_NxD, w_CxD, scale, whole)
        new_max_N = jnp.maximum(max_N, z_NxC.max(axis=-1))
        # exp(-inf - finite) = 0 on the first chunk, so no special case is needed.
        scale_N = jnp.exp(max_N - new_max_N)
        e_NxC = jnp.exp(z_NxC - new_max_N[:, None])
        sum_N = sum_N * scale_N + e_NxC.sum(axis=-1)
        zsum_N = zsum_N * scale_N + (e_NxC * z_NxC).sum(axis=-1)
        return (new_max_N, sum_N, zsum_N), None

    full_nxCxD, tail_TxD = _split(w_VxD, chunk)
    zeros_N = jnp.zeros((n_rows,), jnp.float32)
    carry = (jnp.full((n_rows,), -jnp.inf, jnp.float32), zeros_N, zeros_N)
    carry, _ = jax.lax.scan(absorb, carry, full_nxCxD)
    if tail_TxD.shape[0]:
        carry, _ = absorb(carry, tail_TxD)
    max_N, sum_N, zsum_N = carry
    lse_N = max_N + jnp.log(sum_N)
    entropy_N = lse_N - zsum_N / sum_N
    target_N = jnp.einsum("nd,nd->n", h_NxD, w_VxD[t_N].astype(h_NxD.dtype),
                          preferred_element_type=jnp.float32)
    return target_N * scale - lse_N, entropy_N, lse_N


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _chunked(h_NxD, w_VxD, t_N, chunk, scale, whole):
    logp_N, entropy_N, _ = _forward(h_NxD, w_VxD, t_N, chunk, scale, whole)
    return logp_N, entropy_N


def _chunked_fwd(h_NxD, w_VxD, t_N, chunk, scale, whole):
    logp_N, entropy_N, lse_N = _forward(h_NxD, w_VxD, t_N, chunk, scale, whole)
    return (logp_N, entropy_N), (h_NxD, w_VxD, t_N, lse_N)


def _chunked_bwd(chunk, scale, whole, residuals, cotangents):
    # d logp_n / d z_nv = onehot(t_n)_v - p_nv. The one-hot part is a gather/scatter done
    # once; the softmax part is recomputed chunk by chunk. The entropy output is a metric
    # and gets no gradient (the public function stops it explicitly).
    h_NxD, w_VxD, t_N, lse_N = residuals
    # logp = scale * z_t - lse(scale * z): the scale multiplies both gradients.
    ct_N = cotangents[0].astype(jnp.float32) * scale

    def weighted_softmax(w_CxD):
        p_NxC = jnp.exp(_logits(h_NxD, w_CxD, scale, whole) - lse_N[:, None])
        return p_NxC * ct_N[:, None]

    dt = h_NxD.dtype  # backward matmuls in the compute dtype, accumulated in fp32

    def back(dh_NxD, w_CxD):
        g_NxC = weighted_softmax(w_CxD).astype(dt)
        dh_NxD = dh_NxD + jnp.einsum("nc,cd->nd", g_NxC, _gathered(w_CxD, dt, whole),
                                     preferred_element_type=jnp.float32)
        # D x C output: a contraction over N is ~20% faster this way round on CPU.
        return dh_NxD, jnp.einsum("nc,nd->dc", g_NxC, h_NxD, preferred_element_type=jnp.float32)

    full_nxCxD, tail_TxD = _split(w_VxD, chunk)
    dh_NxD, dw_nxDxC = jax.lax.scan(back, jnp.zeros(h_NxD.shape, jnp.float32), full_nxCxD)
    dw_VxD = jnp.swapaxes(dw_nxDxC, 1, 2).reshape(-1, w_VxD.shape[1])
    if tail_TxD.shape[0]:
        dh_NxD, dw_DxT = back(dh_NxD, tail_TxD)
        dw_VxD = jnp.concatenate([dw_VxD, dw_DxT.T])
    w_t_NxD = w_VxD[t_N].astype(jnp.float32)
    h32_NxD = h_NxD.astype(jnp.float32)
    dh_NxD = ct_N[:, None] * w_t_NxD - dh_NxD
    dw_VxD = (-dw_VxD).at[t_N].add(ct_N[:, None] * h32_NxD)
    return dh_NxD.astype(h_NxD.dtype), dw_VxD.astype(w_VxD.dtype), None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def _kept_forward(h_NxD, w_VxD, t_N, scale, whole):
    """One pass over the N x V logits: row max, then one exp, both sums (softmax, entropy)."""
    z_NxV = _logits(h_NxD, w_VxD, scale, whole)
    max_N = z_NxV.max(axis=-1)
    e_NxV = jnp.exp(z_NxV - max_N[:, None])
    sum_N = e_NxV.sum(axis=-1)
    lse_N = max_N + jnp.log(sum_N)
    entropy_N = lse_N - (e_NxV * z_NxV).sum(axis=-1) / sum_N
    target_N = jnp.take_along_axis(z_NxV, t_N[:, None], axis=-1)[:, 0]
    return target_N - lse_N, entropy_N, e_NxV, sum_N


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _kept(h_NxD, w_VxD, t_N, scale, whole):
    logp_N, entropy_N, _, _ = _kept_forward(h_NxD, w_VxD, t_N, scale, whole)
    return logp_N, entropy_N


def _kept_fwd(h_NxD, w_VxD, t_N, scale, whole):
    logp_N, entropy_N, e_NxV, sum_N = _kept_forward(h_NxD, w_VxD, t_N, scale, whole)
    return (logp_N, entropy_N), (h_NxD, w_VxD, t_N, e_NxV, sum_N)


def _kept_bwd(scale, whole, residuals, cotangents):
    # As `_chunked_bwd`, with the softmax read back (p = e / sum) instead of recomputed:
    # no third matmul over the vocabulary and no second exp pass.
    h_NxD, w_VxD, t_N, e_NxV, sum_N = residuals
    ct_N = cotangents[0].astype(jnp.float32) * scale
    dt = h_NxD.dtype  # backward matmuls in the compute dtype, accumulated in fp32
    g_NxV = (e_NxV * (ct_N / sum_N)[:, None]).astype(dt)
    h32_NxD = h_NxD.astype(jnp.float32)
    dh_NxD = ct_N[:, None] * w_VxD[t_N].astype(jnp.float32) - jnp.einsum(
        "nv,vd->nd", g_NxV, _gathered(w_VxD, dt, whole), preferred_element_type=jnp.float32)
    dw_VxD = (-jnp.einsum("nv,nd->vd", g_NxV, h_NxD, preferred_element_type=jnp.float32)).at[
        t_N].add(ct_N[:, None] * h32_NxD)
    return dh_NxD.astype(h_NxD.dtype), dw_VxD.astype(w_VxD.dtype), None


_kept.defvjp(_kept_fwd, _kept_bwd)


def head_layout(activations: Sharding | None) -> tuple[Sharding | None, Sharding | None]:
    """(rows, whole) for the head from the forward's B x L x D `activations` sharding: the
    N x D hidden states' rows sharded as the batch's, the output weight whole on every
    device (None, None: the compiler's choice)."""
    if not isinstance(activations, NamedSharding):
        return None, None
    mesh = activations.mesh
    rows = activations.spec[0] if activations.spec else None
    return NamedSharding(mesh, PartitionSpec(rows, None)), NamedSharding(mesh, PartitionSpec())


def token_logprobs(
    hidden_NxD: jax.Array,
    unembed_DxV: jax.Array,
    targets_N: jax.Array,
    *,
    vocab_chunk: int = DEFAULT_VOCAB_CHUNK,
    temperature: float = 1.0,
    keep_probs: bool = False,
    activations: Sharding | None = None,
) -> tuple[jax.Array, jax.Array]:
    """log p(target) and softmax entropy (no gradient) of each row, leading dims kept.

    p = softmax(h W / temperature): the distribution a sampler at that temperature draws
    from (before any top-k / top-p truncation). `keep_probs`: the forward keeps the N x V
    fp32 softmax for the backward pass (N x V x 4 bytes; the backward then runs 2 matmuls
    over the vocabulary instead of 3 and no exp); otherwise vocabulary chunks of
    `vocab_chunk` are recomputed in the backward pass (N x chunk bytes). `activations`: the
    B x L x D sharding of the forward (`head_layout`): rows stay on their devices and the
    weight is gathered whole, so no device holds another's rows' logits.
    """
    lead = hidden_NxD.shape[:-1]
    rows, whole = head_layout(activations)
    h_NxD = hidden_NxD.reshape(-1, hidden_NxD.shape[-1])
    if rows is not None:
        h_NxD = jax.lax.with_sharding_constraint(h_NxD, rows)
    # The chunks are rows of V x D: for a tied embedding this is its own layout, so the
    # transpose cancels the model's and the reshape into chunks copies nothing.
    t_N = targets_N.reshape(-1).astype(jnp.int32)
    if keep_probs:
        logp_N, entropy_N = _kept(h_NxD, unembed_DxV.T, t_N, 1.0 / temperature, whole)
    else:
        logp_N, entropy_N = _chunked(h_NxD, unembed_DxV.T, t_N, vocab_chunk, 1.0 / temperature,
                                     whole)
    return logp_N.reshape(lead), jax.lax.stop_gradient(entropy_N).reshape(lead)


def next_token_logprobs(
    hidden_BxLxD: jax.Array,
    unembed_DxV: jax.Array,
    tokens_BxL: jax.Array,
    *,
    vocab_chunk: int = DEFAULT_VOCAB_CHUNK,
    temperature: float = 1.0,
    response_len: int = 0,
    keep_probs: bool = False,
    activations: Sharding | None = None,
) -> tuple[jax.Array, jax.Array]:
    """log p(tokens[l] | tokens[:l]) and the entropy there, aligned to tokens (`activations`:
    see `token_logprobs`).

    `response_len` T > 0: only the last T columns are scored: the head runs on hidden states
    [L - T - 1, L - 1) and the result is BxT, column j for token L - T + j. T = 0: every
    column; the result is BxL with 0 at l = 0.
    """
    chex.assert_rank([hidden_BxLxD, unembed_DxV, tokens_BxL], [3, 2, 2])
    chex.assert_equal_shape_prefix([hidden_BxLxD, tokens_BxL], 2)
    chex.assert_shape(unembed_DxV, (hidden_BxLxD.shape[2], None))
    chex.assert_type(tokens_BxL, int)
    length = tokens_BxL.shape[1]
    if response_len >= length:
        raise ValueError(f"response_len={response_len} needs rows longer than {length} tokens")
    t = response_len or length - 1
    logp, entropy = token_logprobs(
        hidden_BxLxD[:, length - t - 1 : length - 1], unembed_DxV, tokens_BxL[:, length - t :],
        vocab_chunk=vocab_chunk, temperature=temperature, keep_probs=keep_probs,
        activations=activations,
    )
    if response_len:
        return logp, entropy
    pad = ((0, 0), (1, 0))
    return jnp.pad(logp, pad), jnp.pad(entropy, pad)


def reference_logprobs(
    hidden_NxD: jax.Array, unembed_DxV: jax.Array, targets_N: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Plain full-vocabulary log-softmax version of `token_logprobs` (tests, benchmarks)."""
    logits = jnp.einsum("...d,dv->...v", hidden_NxD, unembed_DxV).astype(jnp.float32)
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logp_all, targets_N[..., None].astype(jnp.int32), -1)[..., 0]
    entropy = -(jnp.exp(logp_all) * logp_all).sum(-1)
    return logp, entropy

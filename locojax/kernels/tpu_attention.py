"""Causal training attention on TPUs through JAX's splash attention kernel (flash attention
with block sparsity: no L x S scores or masks in memory, the causal half skipped).

    q_BxLxHxhd, k/v_BxLxKxhd, valid_BxL --vmap over rows--> splash(causal, segments)
        --> ctx_BxLxHxhd

A row's real tokens are segment 1 and its padding segment 0, so a real query reads exactly
the real keys at or before it, as the model's masked softmax does (`ops.masked_attention`
with `qwen3.attention_mask`); a padding query reads padding only, and nothing reads it.
Scores are scaled by hd^-0.5 (the query is scaled before the kernel) and the grouped query
heads read their kv head (h = k * G + g). With the activations sharded by row over a mesh,
the kernel runs per device on its own rows (`shard_map`): a Pallas call is not split by XLA.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

BLOCK = 512
"""Query and key block of every kernel (forward, dq, dkv), or the row length if shorter."""


def applies(length: int) -> bool:
    """Whether rows of `length` tokens tile into the kernel's blocks (multiples of 128)."""
    return length % 128 == 0


@functools.cache
def _kernel(heads: int, length: int, interpret: bool):
    """The kernel for rows of `length` tokens, built once per shape. Its mask tables are
    concrete arrays made outside any trace (`ensure_compile_time_eval`): built inside one,
    they would be that trace's values, and the cached kernel would leak them into the next
    program that uses it."""
    block = min(BLOCK, length)
    while length % block:
        block //= 2
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                              block_q_dkv=block, block_kv_dkv=block,
                              block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    mask = masks.MultiHeadMask([masks.CausalMask((length, length))] * heads)
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                      interpret=interpret)


def _rows(q_BxLxHxhd, k_BxLxKxhd, v_BxLxKxhd, valid_BxL, interpret: bool):
    b, length, h, hd = q_BxLxHxhd.shape
    kernel = _kernel(h, length, interpret)
    q = (q_BxLxHxhd * jnp.asarray(hd**-0.5, q_BxLxHxhd.dtype)).transpose(0, 2, 1, 3)
    k, v = (x.astype(q.dtype).transpose(0, 2, 1, 3) for x in (k_BxLxKxhd, v_BxLxKxhd))
    seg = valid_BxL.astype(jnp.int32)
    ctx = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(s, s)))(
        q, k, v, seg)
    return ctx.transpose(0, 2, 1, 3)


def causal_attention(q_BxLxHxhd, k_BxLxKxhd, v_BxLxKxhd, valid_BxL, *,
                     rows: NamedSharding | None = None, interpret: bool = False) -> jax.Array:
    """softmax(q K^T / sqrt(hd)) V, query i reading the valid keys j <= i (module docstring).
    `rows`: the B x L x D activations' sharding; the kernel then runs per device over the
    mesh axes that split rows."""
    fn = functools.partial(_rows, interpret=interpret)
    if rows is None or not rows.spec or rows.spec[0] is None:
        return fn(q_BxLxHxhd, k_BxLxKxhd, v_BxLxKxhd, valid_BxL)
    row = P(rows.spec[0])
    return jax.shard_map(fn, mesh=rows.mesh, in_specs=(row, row, row, row), out_specs=row,
                         check_vma=False)(q_BxLxHxhd, k_BxLxKxhd, v_BxLxKxhd, valid_BxL)

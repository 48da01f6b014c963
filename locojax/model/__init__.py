"""The Qwen3 decoder in Flax NNX, its KV cache, and Hugging Face checkpoint interop.

Shapes: B batch, L new tokens, S cache slots, D hidden, H query heads, K kv heads,
hd head_dim, V vocab, N layers.

Model (`qwen3.py`)
    Qwen3(arch: ModelArch, *, rngs: nnx.Rngs)
    model(tokens_BxL, positions_BxL, *, cache=None, kv_valid_BxS=None, layers=None,
          rope=None, ops=XLA_OPS) -> (hidden_BxLxD final-normed, KVCache | LayerKVCache | None)
        `rope=` (cos_BxLxR, sin_BxLxR) from `layers.rope_cos_sin` instead of positions
        (pass None): the rollout engine makes them for every slot in a program of its own
        (else XLA redoes cos/sin inside every layer's q/k fusions, per element)
    model.unstack_layers() -> (layer 0 params, ..., layer N-1 params)
        `layers=` these: the layers run unrolled over per-layer weights, with a
        LayerKVCache; made once before a decode loop, each step then reads weights and
        caches in place (slicing a layer out of the stacks copies it every step: ~10%
        of a decode step at the benchmark's size)
    model.unembed() -> W_DxV        (embedding.T when tied, else lm_head kernel)
    model.logits(hidden_BxLxD) -> logits_BxLxV   (fp32)
    split_params(model) -> (graphdef, params)     nnx.Param state, logical axes attached
    compute_copy(params, arch) -> params in arch.dtype (the rollout weights; cast once)

    Precision: parameters are built in `arch.param_dtype` (the trained master copy, fp32 by
    default) and multiplied in `arch.dtype` (the compute dtype): each layer's weights are
    cast inside its scan step (one layer's copy at a time), embedding rows after the gather,
    the output matrix where the logits are made; norm statistics, RoPE and the attention
    softmax stay fp32. Weights already in the compute dtype (a `compute_copy`) are not
    copied again.
    abstract_model(arch) -> (graphdef, params of ShapeDtypeStruct)   allocates nothing
    flat_params(params) -> {'layers/attn/q_proj': nnx.Param, ...}    '/'-joined paths
    params_from_flat(arch, {path: array}) -> params

    Parameter paths/shapes/logical axes equal `compiler.params.param_table`; each Param's
    `out_sharding` metadata holds its logical axes (`nnx.get_partition_spec(params)` under
    logical-axis rules gives mesh specs). Layers are stacked on axis 0 and scanned.

Cache (`kv_cache.py`)
    KVCache(k_NxBxKxSxhd, v_NxBxKxSxhd, end)      pytree; `end` int32 scalar write slot
    init_cache(arch, batch, max_len, dtype=None) -> KVCache   (dtype defaults to arch's)
    LayerKVCache(k_BxKxhdxS: tuple, v_BxKxSxhd: tuple, end)   one array per layer, keys
                                                              transposed (slots last)
    LayerKVCache.from_stacked(cache) -> LayerKVCache
    KV_CACHE_AXES = ('layers', 'batch', 'kv_heads', 'length', 'head_dim')

    A call with a cache writes the L new keys/values at slots [end, end + L) and returns the
    cache with end + L. Query i (at slot end + i) attends to slot j iff j <= end + i and
    kv_valid_BxS[b, j] (None: all valid). Ragged prompts are LEFT-padded so they all end at
    the same slot; positions_BxL count from 0 at each sequence's first real token (padding
    positions are arbitrary, e.g. 0); kv_valid_BxS is False on padding slots and must already
    be True on the slots this call writes. Without a cache, S = L and kv_valid_BxS is BxL.
    Prefill: L = prompt length; decode: L = 1. Shapes are static, so it runs under jax.jit
    and inside lax.while_loop. Writing past S is not checked (XLA clamps the slot index).

    graphdef, params = split_params(Qwen3(arch, rngs=nnx.Rngs(0)))

    @jax.jit
    def decode_step(params, token_Bx1, position_Bx1, cache, kv_valid_BxS):
        model = nnx.merge(graphdef, params)
        hidden_Bx1xD, cache = model(token_Bx1, position_Bx1, cache=cache,
                                    kv_valid_BxS=kv_valid_BxS)
        return model.logits(hidden_Bx1xD)[:, 0], cache

Architecture (`arch.py`)
    ModelArch(num_layers, hidden, num_heads, num_kv_heads, head_dim, ffn, vocab,
              tie_embeddings=True, rope_theta=1e6, norm_eps=1e-6, qk_norm=True,
              dtype='float32' | 'bfloat16', max_position=40960)
    arch_from_hf_config(config_json_dict) -> ModelArch
    hf_config_from_arch(arch) -> config.json dict

Ops (`ops.py`): what the layers compute with, injected by the caller
    ModelOps(matmul=tensordot, attention=masked_attention,
             cached_attention=cached_masked_attention)   frozen, hashable (static under jit)
    model(..., ops=ModelOps(...))   every layer weight is multiplied as ops.matmul(x, w, axes)
        (axes per weight: layers.MATMUL_WEIGHTS; `w` as stored, or as the caller prepared
        `layers=` for its own matmul); attention without a cache is
        ops.attention(q_BxLxHxhd, k_BxSxKxhd, v_BxSxKxhd, mask_BxLxS) -> BxLxHxhd, with a
        cache ops.cached_attention(q, keys, values, mask, keys_transposed=...). The rollout
        engine passes its CPU kernels this way (`locojax.rollout.backend`); the model holds
        no kernel code.

Hugging Face (`hf_io.py`, safetensors only, no torch)
    load_hf_checkpoint(dir, dtype=None) -> (ModelArch, params); CheckpointError names the
        file and tensor of a fault (config.json, missing/extra/misshapen/truncated tensor)
        model.safetensors or model.safetensors.index.json shards; `dtype` casts.
        model = nnx.merge(abstract_model(arch)[0], params)
    load_hf_params(dir, arch, shardings, dtype) -> params
        straight onto `shardings` (make_array_from_callback): each process reads only the
        rows and columns of the torch tensors its devices hold (safetensors slices)
    HfReader(dir, arch).read(name, idx) -> numpy   one box of one of our parameters
    export_hf_checkpoint(arch, params | {path: array}, dir) -> dir
        config.json + model.safetensors loadable by transformers' Qwen3ForCausalLM.
"""

from locojax.model.arch import ModelArch, arch_from_hf_config, hf_config_from_arch
from locojax.model.hf_io import (
    CheckpointError,
    HfReader,
    export_hf_checkpoint,
    load_hf_checkpoint,
    load_hf_params,
)
from locojax.model.kv_cache import KV_CACHE_AXES, KVCache, LayerKVCache, init_cache
from locojax.model.qwen3 import (
    Qwen3,
    abstract_model,
    compute_copy,
    flat_params,
    params_from_flat,
    split_params,
)

__all__ = [
    "KV_CACHE_AXES",
    "CheckpointError",
    "HfReader",
    "KVCache",
    "LayerKVCache",
    "ModelArch",
    "Qwen3",
    "abstract_model",
    "compute_copy",
    "arch_from_hf_config",
    "export_hf_checkpoint",
    "flat_params",
    "hf_config_from_arch",
    "init_cache",
    "load_hf_checkpoint",
    "load_hf_params",
    "params_from_flat",
    "split_params",
]

"""Batched generation: every prompt prefilled once, then rows decoded through a fixed set of slots.

    prompts (N = P, left-padded to W)  --program 1: prefill-->  prompt KV store (N x W slots per
        layer); each prompt's last hidden state -> token 0 of each of its G rows
    rows (B = P x G, row p*G + g)  --program 2: one lax.while_loop over `slots` resident rows-->
        each iteration: free slots take the next pending rows (their prompt's KV copied from
        the store into the slot's first W cache columns, token 0 already drawn), then one
        decode step for every slot: feed its last token (column W + n - 1), draw token n,
        record it at (row, n); a row that draws a stop id or reaches T frees its slot;
        until every row is done (no host round trip, static shapes)
    --> Rollout (tokens, completion, log-probs, mask, lengths), rows in order
    A chunked store (`store_prompts` below the replica's prompts): program 1 prefills the
    first `store_prompts`; once all their rows have entered slots and a slot is free, a loop
    iteration prefills the next `store_prompts` into the store instead of decoding.

Why copy, not a shared prefix block: a slot then holds one contiguous cache that XLA's dense
attention and the CPU decode kernel read as they are; a prefix shared by G rows would need a
gather of the prefix every step (XLA has no paged attention) or a second attention pass over
the prefix with a merge of the softmax statistics. The copy costs one W-slot write per row
(vs a W-token prefill per row on the repeated path) and the store's N x W slots of memory.

`schedule=refill` refills a slot as soon as its row stops; `static` refills only when every
slot is free (waves of `slots` rows; with slots >= rows, the old all-rows-resident loop).
Every draw uses uniforms keyed by (key, row, token index), so the schedule, the slot a row
ran in and the number of slots never change a row's tokens. `prefill=repeated` prefills each
row's own copy of its prompt (the old path; kept for comparison).

With a mesh, rows are split over `batch_axis` (replica): each replica runs its own rows
through its own slots (`shard_map`), and inside it parameters keep their sharding (the
plan's rollout specs: heads, kv heads, ffn and vocab over `tensor`), the KV cache split by
kv head over `tensor` when that divides the kv heads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from compiler.axes import MeshAxis
from compiler.vocab import KernelSwitch, RolloutSchedule
from locojax.model import Qwen3, split_params
from locojax.rollout.backend import XLA, Backend, choose
from locojax.rollout.layout import Layout, ring_columns
from locojax.rollout.prefill import positions, prefill_local
from locojax.rollout.sampler import SamplingSettings
from locojax.rollout.slots import decode_local


class Prefill(StrEnum):
    """How the rows of one prompt get its KV."""

    shared = "shared"
    """Prefill each prompt once; its G rows copy the KV into their slots."""
    repeated = "repeated"
    """Prefill every row's own copy of its prompt (G x the work; for comparison)."""


@dataclass(frozen=True)
class EngineOptions:
    """How the engine runs a generation (not what it samples); hashable."""

    slots: int = 0
    """Rows resident at once per replica (0: all of the replica's rows)."""
    store_prompts: int = 0
    """At most this many prompts' KV in the store at once per replica (0: all of the
    replica's). The store takes the largest divisor of the replica's prompts within the bound;
    with fewer than all, the slot loop prefills each next chunk once the stored prompts' rows
    have all entered slots. Shared prefill of prompts split over the replicas only."""
    schedule: RolloutSchedule = RolloutSchedule.refill
    prefill: Prefill = Prefill.shared
    cpu_kernels: KernelSwitch = KernelSwitch.auto
    """CPU kernels (`locojax.rollout.backend`): auto | on | off."""
    tpu_kernels: KernelSwitch = KernelSwitch.auto
    """The TPU decode kernel (`locojax.kernels.tpu_decode`): auto | on | off."""
    kv_dtype: str | None = None
    """KV-cache dtype ('bfloat16', 'float32'); None: the parameters' dtype."""
    stacked_layers: bool | None = None
    """Scan the layers over their stacked weights (one copy of the weights) rather than unroll
    them over per-layer copies made once per call (faster on a CPU; the CPU kernels need
    them). None: stacked except on a CPU."""

    def __post_init__(self):
        if self.slots < 0:
            raise ValueError(f"slots={self.slots} must be >= 0 (0: every row resident)")
        if self.store_prompts < 0:
            raise ValueError(f"store_prompts={self.store_prompts} must be >= 0 (0: every "
                             "prompt)")
        object.__setattr__(self, "schedule", RolloutSchedule(self.schedule))
        object.__setattr__(self, "prefill", Prefill(self.prefill))
        object.__setattr__(self, "cpu_kernels", KernelSwitch(self.cpu_kernels))
        object.__setattr__(self, "tpu_kernels", KernelSwitch(self.tpu_kernels))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class SlotStats:
    """How the slots were used, per replica."""

    decode_steps_R: jax.Array
    """Decode steps (loop iterations) each replica ran."""
    live_slot_steps_R: jax.Array
    """Slot-steps that decoded a live row (the rest decoded finished rows or empty slots)."""
    slots: int = field(metadata=dict(static=True))
    """Slots per replica."""
    prefill_rows: int = field(metadata=dict(static=True))
    """Rows one prefill ran per replica (its prompts, a chunked store's `store_prompts`, or
    every row on the repeated path)."""

    def idle_share(self) -> float:
        """Share of slot-steps spent on finished rows or empty slots."""
        steps = float(np.sum(np.asarray(self.decode_steps_R))) * self.slots
        return 1.0 - float(np.sum(np.asarray(self.live_slot_steps_R))) / max(steps, 1.0)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Rollout:
    """Sampled completions of B = prompts x G rows, rows of one prompt adjacent."""

    tokens_BxL: jax.Array
    """Left-padded prompt then completion: L = padded prompt length + T."""
    completion_BxT: jax.Array
    """Sampled ids; `pad_id` after a row's stop token."""
    logp_BxT: jax.Array
    """Log-prob of each id under the sampling distribution (behaviour policy); 0 off mask."""
    logp_model_BxT: jax.Array
    """Log-prob of each sampled id under the model's softmax at the sampling temperature, no
    top-k / top-p truncation (the trainer's pi_old at that temperature); 0 off mask."""
    mask_BxT: jax.Array
    """1.0 on real completion tokens (the stop token included), 0.0 after."""
    lengths_B: jax.Array
    """Completion tokens per row (int32), the stop token included."""
    prompt_len_B: jax.Array
    """Real prompt tokens per row (int32)."""
    stats: SlotStats | None = None
    """How the slots were used (None for a rollout built elsewhere)."""

    @property
    def prompt_width(self) -> int:
        """Padded prompt length: completion token t sits at column prompt_width + t."""
        return self.tokens_BxL.shape[1] - self.completion_BxT.shape[1]

    def positions_BxL(self) -> jax.Array:
        """Rotary positions of `tokens_BxL`, counted from each row's first real token."""
        return positions(self.prompt_len_B, self.prompt_width, self.tokens_BxL.shape[1])

    def valid_BxL(self) -> jax.Array:
        """True on real prompt tokens and real completion tokens."""
        width, length = self.prompt_width, self.tokens_BxL.shape[1]
        col_L = jnp.arange(length, dtype=jnp.int32)
        first_B = width - self.prompt_len_B
        return (col_L >= first_B[:, None]) & (col_L < width + self.lengths_B[:, None])


def pad_prompts(
    prompts: Sequence[Sequence[int]], pad_id: int = 0, length: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad ragged prompts to `length` (default: the longest): (prompt_BxP, prompt_len_B)."""
    lens = np.array([len(p) for p in prompts], np.int32)
    width = int(lens.max()) if length is None else length
    if lens.min() < 1 or lens.max() > width:
        raise ValueError(f"prompt lengths must be in [1, {width}]; got {lens.min()}..{lens.max()}")
    out = np.full((len(prompts), width), pad_id, np.int32)
    for row, p in enumerate(prompts):
        out[row, width - len(p) :] = np.asarray(p, np.int32)
    return out, lens


def _manual(fn, layout: Layout, in_specs, out_specs):
    """`fn` per replica (shard_map over the batch axis) when rows are split, else as is. Mesh
    axes of one device are manual too: they split nothing, and a Pallas kernel (the TPU
    decode kernel) lowers only where no axis is left to XLA's partitioner."""
    if not layout.manual:
        return fn
    single = {a for a, n in layout.mesh.shape.items() if n == 1}
    return jax.shard_map(fn, mesh=layout.mesh, in_specs=in_specs, out_specs=out_specs,
                         axis_names=frozenset({layout.batch_axis, *single}), check_vma=False)


def _specs(layout: Layout):
    rows = P(layout.batch_axis) if layout.manual else None
    return rows, rows if layout.store_sharded else P()


@partial(jax.jit, static_argnames=("graphdef", "settings", "layout"))
def _prefill(params, prompt_NxW, len_N, key, *, graphdef, settings, layout):
    """Program 1 (`prefill.py`): the prompt KV store, token 0 of every row, the tables."""
    rows, store = _specs(layout)
    fn = partial(prefill_local, graphdef=graphdef, settings=settings, layout=layout)
    return _manual(fn, layout, (P(), store, store, P()),
                   (store, store, rows, rows, P()))(params, prompt_NxW, len_N, key)


@partial(jax.jit, static_argnames=("graphdef", "settings", "layout", "backend"))
def _decode(params, store_k, store_v, first, len_N, u_BxTx2, rope_SxR, prompt_BxW,
            prompt_NxW=None, *, graphdef, settings, layout, backend: Backend = XLA):
    """Program 2 (`slots.py`): every row through the slots; the Rollout. `prompt_NxW`: the
    prompts a chunked store prefills inside the loop (`layout.chunked`; else None)."""
    rows, store = _specs(layout)
    fn = partial(decode_local, graphdef=graphdef, settings=settings, layout=layout,
                 backend=backend)
    args = (params, store_k, store_v, first, len_N, u_BxTx2, rope_SxR)
    specs = (P(), store, store, rows, store, rows, P())
    if layout.chunked:
        args, specs = args + (prompt_NxW,), specs + (store,)
    completion, logp, logp_model, lengths, len_B, steps, live = _manual(
        fn, layout, specs, (rows,) * 7)(*args)
    T = settings.max_new_tokens
    mask_BxT = (jnp.arange(T, dtype=jnp.int32) < lengths[:, None]).astype(jnp.float32)
    return Rollout(
        tokens_BxL=jnp.concatenate([prompt_BxW, completion], axis=1),
        completion_BxT=completion, logp_BxT=logp, logp_model_BxT=logp_model, mask_BxT=mask_BxT,
        lengths_B=lengths, prompt_len_B=len_B,
        stats=SlotStats(steps, live, layout.slots, layout.store_rows))


def generate(
    model: Qwen3 | tuple[nnx.GraphDef, nnx.State],
    prompts: Sequence[Sequence[int]] | tuple[np.ndarray, np.ndarray],
    settings: SamplingSettings,
    key: jax.Array,
    *,
    group_size: int = 1,
    mesh: Mesh | None = None,
    batch_axis: MeshAxis = MeshAxis.REPLICA,
    tensor_axis: MeshAxis = MeshAxis.TENSOR,
    options: EngineOptions = EngineOptions(),
) -> Rollout:
    """Sample `group_size` completions of every prompt (two compiled programs, see above).

    `model` is a Qwen3 module or its (graphdef, params), in any compute dtype. `prompts` is
    a ragged list of id lists or (left-padded prompt_PxW, prompt_len_P). With a `mesh`, rows
    are split over `batch_axis`; parameters already on that mesh keep their sharding (e.g.
    the plan's rollout specs over `tensor_axis`), the rest are replicated.
    """
    job = _setup(model, prompts, settings, group_size, mesh, batch_axis, tensor_axis, options)
    return job.run(key)[0]


def generate_timed(model, prompts, settings, key, *, group_size=1, mesh=None,
                   batch_axis=MeshAxis.REPLICA, tensor_axis=MeshAxis.TENSOR,
                   options: EngineOptions = EngineOptions()) -> tuple[Rollout, float]:
    """`generate`, and the seconds of its prefill program (it blocks between the programs)."""
    job = _setup(model, prompts, settings, group_size, mesh, batch_axis, tensor_axis, options)
    return job.run(key, timed=True)


def compile_programs(model, prompts, settings, *, group_size=1, mesh=None,
                     batch_axis=MeshAxis.REPLICA, tensor_axis=MeshAxis.TENSOR,
                     options: EngineOptions = EngineOptions(), seconds: dict | None = None):
    """The two compiled programs of `generate` (prefill, slots), nothing run: e.g. for
    `memory_analysis()`. `model`'s params and the padded `prompts` (prompt_PxW, len_P) may be
    `jax.ShapeDtypeStruct`s (with shardings): nothing is then placed on a device, so the
    mesh may be of compile-only devices (`jax.experimental.topologies`). `seconds`, when
    given, receives each program's lowering + compile seconds ('prefill', 'slots')."""
    job = _setup(model, prompts, settings, group_size, mesh, batch_axis, tensor_axis, options)
    timed = {} if seconds is None else seconds
    start = time.perf_counter()
    _, prefill, decode = _lowered(job, None)
    timed["prefill"] = time.perf_counter() - start
    decode = decode.compile()
    timed["slots"] = time.perf_counter() - start - timed["prefill"]
    return prefill, decode


def lower_programs(model, prompts, settings, *, group_size=1, mesh=None,
                   batch_axis=MeshAxis.REPLICA, tensor_axis=MeshAxis.TENSOR,
                   options: EngineOptions = EngineOptions(),
                   platforms: tuple[str, ...] | None = None):
    """The two lowered programs (prefill, slots) of `compile_programs`. `platforms` (e.g.
    `('cuda',)`) lowers them for those platforms rather than the mesh's devices' (StableHLO
    only; the slot program's inputs take the prefill's output shardings from its compile for
    the mesh's own devices)."""
    job = _setup(model, prompts, settings, group_size, mesh, batch_axis, tensor_axis, options)
    prefill, _, decode = _lowered(job, platforms)
    return prefill, decode


def _lowered(job: _Job, platforms: tuple[str, ...] | None):
    """(prefill lowered, prefill compiled for the mesh's devices, slot program lowered)."""
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
    static = dict(graphdef=job.graphdef, settings=job.settings, layout=job.layout)
    prefill_args = (job.params, job.store_prompts, job.store_len, key)
    prefill = _prefill.lower(*prefill_args, **static)
    compiled = prefill.compile()
    outs = [jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=s) for o, s in zip(
        jax.tree.leaves(compiled.out_info), jax.tree.leaves(compiled.output_shardings),
        strict=True)]
    store_k, store_v, first, u_BxTx2, rope = jax.tree.unflatten(
        jax.tree.structure(compiled.out_info), outs)
    decode_args = (job.params, store_k, store_v, first, job.store_len, u_BxTx2, rope,
                   job.prompt_BxW, job.chunk_prompts)
    if platforms is None:
        return prefill, compiled, _decode.lower(*decode_args, backend=job.backend, **static)
    return (_prefill.trace(*prefill_args, **static).lower(lowering_platforms=platforms),
            compiled, _decode.trace(*decode_args, backend=job.backend, **static).lower(
                lowering_platforms=platforms))


@dataclass(frozen=True)
class _Job:
    """One generation's inputs and static layout, ready to run."""

    graphdef: nnx.GraphDef
    params: nnx.State
    layout: Layout
    backend: Backend
    settings: SamplingSettings
    store_prompts: jax.Array
    store_len: jax.Array
    prompt_BxW: jax.Array

    @property
    def chunk_prompts(self) -> jax.Array | None:
        """The prompts the slot loop prefills into a chunked store (else None)."""
        return self.store_prompts if self.layout.chunked else None

    def run(self, key: jax.Array, timed: bool = False) -> tuple[Rollout, float]:
        static = dict(graphdef=self.graphdef, settings=self.settings, layout=self.layout)
        start = time.perf_counter()
        store_k, store_v, first, u_BxTx2, rope = _prefill(
            self.params, self.store_prompts, self.store_len, key, **static)
        prefill_s = 0.0
        if timed:
            jax.block_until_ready(store_k)
            prefill_s = time.perf_counter() - start
        out = _decode(self.params, store_k, store_v, first, self.store_len, u_BxTx2, rope,
                      self.prompt_BxW, self.chunk_prompts, backend=self.backend, **static)
        return out, prefill_s


def _setup(model, prompts, settings, group_size, mesh, batch_axis, tensor_axis,
           options: EngineOptions) -> _Job:
    graphdef, params = split_params(model) if isinstance(model, Qwen3) else model
    batch_axis, tensor_axis = MeshAxis(batch_axis), MeshAxis(tensor_axis)
    prompt_PxW, len_P = _as_padded(prompts, settings.pad_id)
    n_prompts, width = prompt_PxW.shape
    rows = n_prompts * group_size
    replicas = 1
    if mesh is not None:
        replicas = mesh.shape.get(batch_axis, 1)
        if rows % replicas:
            raise ValueError(f"prompts x group_size = {n_prompts} x {group_size} rows do not "
                             f"split over {replicas} devices of mesh axis '{batch_axis}'")
        params = _on_mesh(params, mesh)
    shared = options.prefill == Prefill.shared
    # A replica's rows are whole groups when the prompts split evenly over the replicas;
    # else every replica prefills every prompt (still once per prompt per replica).
    store_sharded = not shared or n_prompts % replicas == 0
    per_replica = rows // replicas
    store_rows = per_replica if not shared else (
        n_prompts // replicas if store_sharded else n_prompts)
    if options.store_prompts and shared and store_sharded:
        # The largest divisor of the replica's prompts within the bound (held-out evaluation
        # brings its own number of prompts).
        store_rows = max(k for k in range(1, min(options.store_prompts, store_rows) + 1)
                         if store_rows % k == 0)
    arch = nnx.merge(graphdef, params).arch
    tensor = None
    if mesh is not None and mesh.shape.get(tensor_axis, 1) > 1:
        if arch.num_kv_heads % mesh.shape[tensor_axis] == 0:
            tensor = tensor_axis
    stacked = options.stacked_layers
    if stacked is None:
        stacked = _platform(params, mesh) != "cpu"
    layout = Layout(width=width, rows=per_replica, store_rows=store_rows,
                    group_size=group_size, shared=shared, store_sharded=store_sharded,
                    slots=min(options.slots or per_replica, per_replica),
                    refill=options.schedule == RolloutSchedule.refill,
                    kv_dtype=options.kv_dtype or str(jax.tree.leaves(params)[0].dtype),
                    stacked=stacked,
                    ring=ring_columns(arch, width + settings.max_new_tokens),
                    mesh=mesh, batch_axis=batch_axis if replicas > 1 else None,
                    tensor_axis=tensor)
    place = _abstract_inputs if isinstance(prompt_PxW, jax.ShapeDtypeStruct) else _inputs
    store_prompts, store_len, prompt_BxW = place(prompt_PxW, len_P, layout, group_size)
    backend = choose(options.cpu_kernels, params, mesh, stacked, options.tpu_kernels,
                     arch.head_dim)
    return _Job(graphdef, params, layout, backend, settings, store_prompts, store_len,
                prompt_BxW)


def _shardings(layout: Layout) -> tuple[NamedSharding, NamedSharding] | None:
    """(row, store) shardings of the programs' prompt inputs on the layout's mesh."""
    if layout.mesh is None:
        return None
    row_sharding = NamedSharding(layout.mesh, P(layout.batch_axis))
    return row_sharding, row_sharding if layout.store_sharded else NamedSharding(layout.mesh,
                                                                                 P())


def _inputs(prompt_PxW: jax.Array, len_P: jax.Array, layout: Layout, group_size: int):
    """(store prompts, store lengths, prompt_BxW) placed on the layout's mesh."""
    store_prompts, store_len = ((prompt_PxW, len_P) if layout.shared
                                else (jnp.repeat(prompt_PxW, group_size, 0),
                                      jnp.repeat(len_P, group_size, 0)))
    prompt_BxW = jnp.repeat(prompt_PxW, group_size, 0)
    shardings = _shardings(layout)
    if shardings is not None:
        row_sharding, store_sharding = shardings
        store_prompts, store_len = jax.device_put((store_prompts, store_len), store_sharding)
        prompt_BxW = jax.device_put(prompt_BxW, row_sharding)
    return store_prompts, store_len, prompt_BxW


def _abstract_inputs(prompt_PxW: jax.ShapeDtypeStruct, len_P: jax.ShapeDtypeStruct,
                     layout: Layout, group_size: int):
    """`_inputs` as shape/dtype/sharding structs: nothing is placed (compile-only devices
    hold no data)."""
    (n, width), rows = prompt_PxW.shape, prompt_PxW.shape[0] * group_size
    row_sharding, store_sharding = _shardings(layout) or (None, None)
    store = n if layout.shared else rows
    return (jax.ShapeDtypeStruct((store, width), jnp.int32, sharding=store_sharding),
            jax.ShapeDtypeStruct((store,), jnp.int32, sharding=store_sharding),
            jax.ShapeDtypeStruct((rows, width), jnp.int32, sharding=row_sharding))


def _platform(params, mesh: Mesh | None) -> str:
    """The platform the generation runs on."""
    if mesh is not None:
        return mesh.devices.flat[0].platform
    leaf = jax.tree.leaves(params)[0]
    sharding = getattr(leaf, "sharding", None)
    return next(iter(sharding.device_set)).platform if sharding else jax.default_backend()


def _as_padded(prompts, pad_id):
    """(prompt_PxW, len_P) as int32, from ragged id lists or a padded pair (checked: chex);
    a pair of `jax.ShapeDtypeStruct`s is returned as it is (`compile_programs`)."""
    if isinstance(prompts, tuple) and all(isinstance(x, jax.ShapeDtypeStruct) for x in prompts):
        prompt_PxW, len_P = prompts
        chex.assert_shape(len_P, (prompt_PxW.shape[0],))
        return prompt_PxW, len_P
    if isinstance(prompts, tuple) and len(prompts) == 2 and np.ndim(prompts[0]) == 2:
        prompt_PxW, len_P = prompts
        chex.assert_rank(prompt_PxW, 2)
        chex.assert_shape(len_P, (prompt_PxW.shape[0],))
        chex.assert_type([prompt_PxW, len_P], int)
    else:
        prompt_PxW, len_P = pad_prompts(prompts, pad_id)
    return jnp.asarray(prompt_PxW, jnp.int32), jnp.asarray(len_P, jnp.int32)


def _on_mesh(params: nnx.State, mesh: Mesh) -> nnx.State:
    """Parameters already placed on `mesh` keep their sharding; the rest are replicated."""
    replicated = NamedSharding(mesh, P())

    def place(x):
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
            return x
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated)
        return jax.device_put(x, replicated)

    return jax.tree.map(place, params)

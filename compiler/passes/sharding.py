"""Pass 2: meshes and a PartitionSpec for every parameter, per role, from rule tables.

Training (storage) mesh (data, fsdp): fsdp spans the devices of `fsdp_hosts` trainer hosts,
the smallest divisor of the trainer host count whose training state fits (FSDP within a host
when it can); data = trainer hosts / fsdp_hosts. Rule: each parameter's `embed` dimension is
split over fsdp (every parameter but the norm scales has exactly one); everything else is
replicated; the batch is split over (data, fsdp).

Rollout mesh of one replica group (replica, tensor): tensor = `mesh.rollout_tensor_parallel`,
doubled while the weights do not fit, up to one host's devices for a family the runtime runs
(its rollout meshes are host-local); for plan-only families a replica may span hosts. Rule:
heads, kv_heads, mlp and vocab over tensor (kv_heads replicated when tensor does not divide
them, as GQA serving does); the batch over replica.

A sharded dimension its mesh axis does not divide is a `PlanError` naming the config key
that set the axis size.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

from compiler.axes import LogicalAxis, MeshAxis
from compiler.config import AlgorithmConfig, MeshConfig, MeshKind, ModelConfig
from compiler.cost import memory
from compiler.errors import PlanError
from compiler.model_entry import RUNTIME_FAMILIES
from compiler.params import ParamInfo
from compiler.passes.lengths import Lengths
from compiler.plan import Partitions, RoleSharding, Sharding, Topology
from compiler.vocab import Remat

DATA, FSDP, REPLICA, TENSOR = MeshAxis.DATA, MeshAxis.FSDP, MeshAxis.REPLICA, MeshAxis.TENSOR
_L = LogicalAxis
TRAIN_RULES = {_L.EMBED: (FSDP,), _L.BATCH: (DATA, FSDP)}
ROLLOUT_RULES = {_L.HEADS: (TENSOR,), _L.KV_HEADS: (TENSOR,), _L.MLP: (TENSOR,),
                 _L.VOCAB: (TENSOR,), _L.BATCH: (REPLICA,)}
ROLLOUT_OPTIONAL = (_L.KV_HEADS,)
MODEL_FIELD = {_L.EMBED: "model.hidden", _L.HEADS: "model.num_heads", _L.MLP: "model.ffn",
               _L.KV_HEADS: "model.num_kv_heads", _L.VOCAB: "model.vocab",
               _L.HEAD_DIM: "model.head_dim", _L.LAYERS: "model.num_layers"}
"""Which model field sets each logical dimension (for error messages)."""

Specs = dict[str, tuple[MeshAxis | None, ...]]
OnIndivisible = Callable[[ParamInfo, LogicalAxis, int, MeshAxis, int], None]


def resolve_specs(table: tuple[ParamInfo, ...], rules: dict[LogicalAxis, tuple[MeshAxis, ...]],
                  optional: tuple[LogicalAxis, ...], mesh: dict[MeshAxis, int],
                  on_indivisible: OnIndivisible | None) -> Specs:
    """PartitionSpec of each parameter; `on_indivisible` None replicates instead of raising."""
    specs: Specs = {}
    for p in table:
        spec: list[MeshAxis | None] = []
        for dim, axis in zip(p.shape, p.axes, strict=True):
            target = rules.get(axis, ())
            # Parameters never carry `batch`; one mesh axis shards at most one dim of an array.
            if len(target) != 1 or target[0] in spec:
                spec.append(None)
                continue
            size = mesh[target[0]]
            if dim % size == 0:
                spec.append(target[0])
                continue
            if on_indivisible is not None and axis not in optional:
                on_indivisible(p, axis, dim, target[0], size)
            spec.append(None)
        specs[p.name] = tuple(spec)
    return specs


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def device_key(mesh: MeshConfig, topo: Topology, fsdp_hosts: int) -> tuple[str, object]:
    """The config key that sets the fsdp axis size."""
    if topo.mesh_kind == MeshKind.cpu:
        if fsdp_hosts == 1:
            return "mesh.devices_per_host", mesh.devices_per_host
        return "mesh.hosts", mesh.hosts
    if topo.mesh_kind in (MeshKind.tpu, MeshKind.gpu):
        return "mesh.chips", mesh.chips
    return "mesh.kind", mesh.kind


def train_layout(model: ModelConfig, table: tuple[ParamInfo, ...], algorithm: AlgorithmConfig,
                 mesh_cfg: MeshConfig, lens: Lengths, topo: Topology,
                 parts: Partitions) -> tuple[RoleSharding, int]:
    """Training mesh, specs and the fsdp host group size."""
    per_dev = topo.devices_per_host
    trainers = len(parts.trainer_hosts)
    per_param = memory.train_state_bytes_per_param(model, algorithm)
    need = sum(p.size for p in table) * per_param
    budget = topo.device_memory_bytes * memory.TRAIN_STATE_FRACTION
    fits = [h for h in _divisors(trainers) if need / (h * per_dev) <= budget]
    if not fits:
        devices = trainers * per_dev
        raise PlanError("model", model.name,
                        f"training state needs {need:.4g} B ({per_param} B/param) but the "
                        f"{devices} trainer devices hold {devices * budget:.4g} B "
                        f"({memory.TRAIN_STATE_FRACTION:.0%} of {topo.device_memory_bytes:.4g} B "
                        "each)", "train_memory")
    # Of those, the smallest group where a train step of one row per micro-batch fits too
    # (FSDP wider shards gradients and copies thinner); else the smallest, and the batching
    # pass says what does not fit.
    fsdp_hosts = next((h for h in fits if _one_row_step(model, table, algorithm, lens, topo,
                                                        h * per_dev)
                       <= topo.device_memory_bytes * memory.TRAIN_STEP_FRACTION), fits[0])
    mesh = {DATA: trainers // fsdp_hosts, FSDP: fsdp_hosts * per_dev}
    key, value = device_key(mesh_cfg, topo, fsdp_hosts)

    def fail(p: ParamInfo, axis: LogicalAxis, dim: int, mesh_axis: MeshAxis, size: int) -> None:
        raise PlanError(key, value, f"{MODEL_FIELD.get(axis, axis)}={dim} is not divisible by "
                        f"the {mesh_axis} axis of {size} devices", "axis_divides_dim")

    specs = resolve_specs(table, TRAIN_RULES, (), mesh, fail)
    state = memory.sharded_elements(table, specs, mesh) * per_param
    return RoleSharding(mesh, dict(TRAIN_RULES), (), specs, state), fsdp_hosts


def _one_row_step(model: ModelConfig, table: tuple[ParamInfo, ...], algorithm: AlgorithmConfig,
                  lens: Lengths, topo: Topology, fsdp: int) -> float:
    """Bytes of a train step of one row per micro-batch with the state split `fsdp` ways."""
    return memory.train_step_memory(
        model, params_per_device=sum(p.size for p in table) / fsdp, fsdp=fsdp, batch_rows=1,
        micro_rows=1, micro_batches=2, seq_len=lens.seq, response_len=lens.response,
        remat=algorithm.remat == Remat.block, keep_probs=False,
        fused_attention=memory.fused_attention(model, topo.hardware.platform, lens.seq,
                                                topo.devices),
        platform=topo.hardware.platform, table=table,
        adapters=memory.adapter_elements(model, algorithm)).total


def _tensor_candidates(t0: int, per_host: int, rollout_hosts: int) -> list[int]:
    """Tensor sizes t0 * 2^k that divide a host or span a divisor of the rollout hosts."""
    out, t = [], t0
    while t <= per_host * rollout_hosts:
        if per_host % t == 0 or (t % per_host == 0 and rollout_hosts % (t // per_host) == 0):
            out.append(t)
        t *= 2
    return out


def rollout_layout(model: ModelConfig, table: tuple[ParamInfo, ...], mesh_cfg: MeshConfig,
                   topo: Topology, parts: Partitions,
                   train_state_per_device: float) -> tuple[RoleSharding, int]:
    """Rollout mesh of one replica group, specs, and hosts per replica group."""
    t0, per_host = mesh_cfg.rollout_tensor_parallel, topo.devices_per_host
    if t0 < 1:
        raise PlanError("mesh.rollout_tensor_parallel", t0, "must be at least 1", "positive")
    # Every runtime (CO, DA, the single controller) builds its rollout mesh from one host's
    # devices, so a model the runtime can run never gets a replica across hosts; plan-only
    # families (inspection, the cost model) keep the cross-host layout a Pathways-style
    # runtime would use.
    runnable = model.family in RUNTIME_FAMILIES
    if runnable and t0 > per_host:
        raise PlanError("mesh.rollout_tensor_parallel", t0,
                        f"is more than the {per_host} devices of one host: the runtime rolls "
                        "out host-locally (CO, DA and the single controller), so rollout "
                        "tensor parallelism cannot span hosts", "tensor_layout")
    rollout_hosts = 1 if runnable else len(parts.rollout_hosts)
    candidates = _tensor_candidates(t0, per_host, rollout_hosts)
    if not candidates or candidates[0] != t0:
        raise PlanError("mesh.rollout_tensor_parallel", t0,
                        f"must divide the {per_host} devices of a host, or be a multiple of it "
                        f"spanning a number of hosts that divides the {rollout_hosts} rollout "
                        "hosts", "tensor_layout")
    b = memory.dtype_bytes(model)
    shared = parts.rollout_hosts == parts.trainer_hosts
    budget = topo.device_memory_bytes * memory.ROLLOUT_FRACTION
    budget -= train_state_per_device if shared else 0.0
    weight_budget = budget * memory.ROLLOUT_WEIGHT_SHARE

    def mesh_of(t: int) -> dict[MeshAxis, int]:
        group = max(1, t // per_host) * per_host
        return {REPLICA: group // t, TENSOR: t}

    def weights(t: int) -> float:
        lenient = resolve_specs(table, ROLLOUT_RULES, ROLLOUT_OPTIONAL, mesh_of(t), None)
        return memory.sharded_elements(table, lenient, mesh_of(t)) * b

    tensor = next((t for t in candidates if weights(t) <= weight_budget), None)
    if tensor is None:
        raise PlanError("model", model.name,
                        f"rollout weights need {weights(candidates[-1]):.4g} B per device even at "
                        f"tensor={candidates[-1]}, over the {max(weight_budget, 0):.4g} B a device "
                        "can give them", "rollout_memory")
    widened = "" if tensor == t0 else f" (widened from {t0} so the weights fit)"

    def fail(p: ParamInfo, axis: LogicalAxis, dim: int, mesh_axis: MeshAxis, size: int) -> None:
        raise PlanError("mesh.rollout_tensor_parallel", t0,
                        f"{MODEL_FIELD.get(axis, axis)}={dim} is not divisible by the "
                        f"{mesh_axis} axis of {size} devices{widened}", "axis_divides_dim")

    mesh = mesh_of(tensor)
    specs = resolve_specs(table, ROLLOUT_RULES, ROLLOUT_OPTIONAL, mesh, fail)
    per_device = memory.sharded_elements(table, specs, mesh) * b
    role = RoleSharding(mesh, dict(ROLLOUT_RULES), ROLLOUT_OPTIONAL, specs, per_device)
    return role, max(1, tensor // per_host)


def shard(model: ModelConfig, table: tuple[ParamInfo, ...], algorithm: AlgorithmConfig,
          mesh: MeshConfig, lens: Lengths, topo: Topology, parts: Partitions) -> Sharding:
    """Both roles' layouts (`table`: the model's parameters; `lens`: the rows' lengths)."""
    if model.num_kv_heads < 1 or model.num_heads % model.num_kv_heads:
        raise PlanError("model.num_kv_heads", model.num_kv_heads,
                        f"must divide model.num_heads={model.num_heads}", "model_shape")
    train, fsdp_hosts = train_layout(model, table, algorithm, mesh, lens, topo, parts)
    rollout, hosts_per_replica = rollout_layout(model, table, mesh, topo, parts,
                                                train.bytes_per_device)
    return Sharding(
        train=train, rollout=rollout, fsdp_hosts=fsdp_hosts,
        data_replicas=len(parts.trainer_hosts) // fsdp_hosts,
        rollout_hosts_per_replica=hosts_per_replica,
        rollout_groups=len(parts.rollout_hosts) // hosts_per_replica,
        train_state_bytes_per_param=memory.train_state_bytes_per_param(model, algorithm))


def spec_split(spec: tuple[MeshAxis | None, ...], mesh: dict[MeshAxis, int]) -> int:
    """Ways a parameter is split by its spec."""
    return prod(mesh[a] for a in spec if a is not None)

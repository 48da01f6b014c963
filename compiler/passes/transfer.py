"""Pass 4: the weight-transfer schedule, trainer hosts -> rollout hosts, after each update.

Slices: the parameter table, in order, cut into `fsdp_hosts` contiguous slices of about
equal bytes (cuts fall between rows of a parameter's leading dimension, so a stacked layer
parameter may be split across slices). Host s of every trainer group (a group of
`fsdp_hosts` hosts holds one full copy of the state) sends slice s.

DA rounds: rollout host j is served by trainer group j mod data_replicas. Within a group of
k senders and m receivers, round r has sender s send its slice to receiver (s + r) mod
max(k, m) when that receiver exists: a round-robin edge colouring of the complete k x m
bipartite graph, so every receiver gets every slice exactly once, and in each round no host
sends twice or receives twice. All groups run their rounds in parallel: max(k, ceil(R /
data)) rounds in all, which is also the lower bound for that one-sender-per-slice layout.

CO: one round of on-host reshards (src == dst, the whole model), link `none`.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

from compiler.config import ModelConfig
from compiler.cost.memory import dtype_bytes
from compiler.errors import PlanInvariantError
from compiler.params import ParamInfo
from compiler.plan import (
    ParamPiece,
    Partitions,
    Send,
    Sharding,
    Topology,
    TransferPlan,
    WeightSlice,
)


def split_slices(table: tuple[ParamInfo, ...], k: int, b: int) -> tuple[WeightSlice, ...]:
    """`k` contiguous slices of about equal bytes, cut between leading-dimension rows."""
    rows = [p.shape[0] for p in table]
    row_bytes = [p.size // p.shape[0] * b for p in table]
    start_rows = [0, *accumulate(rows)]
    start_bytes = [0, *accumulate(r * rb for r, rb in zip(rows, row_bytes, strict=True))]
    total_rows, total = start_rows[-1], start_bytes[-1]
    if total_rows < k:
        raise PlanInvariantError(f"{total_rows} parameter rows cannot fill {k} slices")
    cuts = [0]
    for i in range(1, k):
        target = total * i / k
        j = min(bisect_right(start_bytes, target) - 1, len(table) - 1)
        cut = start_rows[j] + round((target - start_bytes[j]) / row_bytes[j])
        cuts.append(min(max(cut, cuts[-1] + 1), total_rows - (k - i)))
    cuts.append(total_rows)
    slices = []
    for i in range(k):
        lo, hi = cuts[i], cuts[i + 1]
        pieces, size = [], 0
        for j in range(bisect_right(start_rows, lo) - 1, len(table)):
            if start_rows[j] >= hi:
                break
            base = start_rows[j]
            a, z = max(lo, base) - base, min(hi, start_rows[j + 1]) - base
            pieces.append(ParamPiece(table[j].name, a, z))
            size += (z - a) * row_bytes[j]
        slices.append(WeightSlice(i, tuple(pieces), size))
    return tuple(slices)


def _params(piece_slice: WeightSlice) -> tuple[str, ...]:
    return tuple(p.name for p in piece_slice.pieces)


def da_rounds(senders: tuple[int, ...], receivers: tuple[int, ...], slices: tuple[WeightSlice, ...],
              groups: int) -> tuple[tuple[Send, ...], ...]:
    """Round-robin rounds from each trainer group to the rollout hosts it serves."""
    k = len(slices)
    rounds: list[list[Send]] = []
    for g in range(groups):
        group_senders = senders[g * k:(g + 1) * k]
        served = receivers[g::groups]
        width = max(k, len(served))
        for r in range(width if served else 0):
            if r == len(rounds):
                rounds.append([])
            for s, src in enumerate(group_senders):
                idx = (s + r) % width
                if idx < len(served):
                    sl = slices[s]
                    rounds[r].append(Send(src, served[idx], s, _params(sl), sl.bytes))
    return tuple(tuple(r) for r in rounds)


def transfer(model: ModelConfig, table: tuple[ParamInfo, ...], topo: Topology, parts: Partitions,
             sharding: Sharding, adapters: tuple[ParamInfo, ...] = ()) -> TransferPlan:
    """The transfer schedule of the plan's placement (`table`: the model's parameters).

    With LoRA `adapters` (`params.adapter_table`), DA sends the adapters only, in the
    compute dtype (each rollout host merges them into the base it holds); CO merges on the
    host, so its reshard stays the whole model."""
    b = dtype_bytes(model)
    model_bytes = sum(p.size for p in table) * b
    if parts.rollout_hosts == parts.trainer_hosts:
        whole = split_slices(table, 1, b)
        sends = tuple(Send(h, h, 0, _params(whole[0]), model_bytes) for h in parts.rollout_hosts)
        return TransferPlan("none", whole, (sends,), model_bytes * len(sends), (model_bytes,),
                            model_bytes)
    slices = split_slices(adapters or table, sharding.fsdp_hosts, b)
    rounds = da_rounds(parts.trainer_hosts, parts.rollout_hosts, slices, sharding.data_replicas)
    link = "ici" if topo.platform == "tpu" else "dcn"
    return TransferPlan(
        link=link, slices=slices, rounds=rounds,
        total_bytes=sum(s.bytes for r in rounds for s in r),
        round_bytes=tuple(max(s.bytes for s in r) for r in rounds), model_bytes=model_bytes)

"""What the compiler says about one compiled program: memory, FLOPs, collectives, out of memory.

    compiled.memory_analysis()  -> Memory (argument, output, alias, temp bytes; peak per device)
    compiled.cost_analysis()    -> flops, bytes accessed (the compiler's counts: every while /
                                   scan body once)
    compiled.as_text()          -> collectives (kind, count, bytes of their result shapes, loop
                                   bodies times their trip counts: `hloflops`)
    the compiler's RESOURCE_EXHAUSTED message -> ProgramOutOfMemory (needed, available bytes)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod

from locojax.aot.hloflops import executions

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                    "collective-permute")
"""HLO collectives counted in the optimised module (their `-start` halves count once)."""
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
                "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_SHAPE = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")
_OP = re.compile(r"=\s*(\(.*?\)|\S+)\s+(" + "|".join(COLLECTIVE_KINDS) + r")(-start)?\(")
_CHANNEL = re.compile(r"\bchannel_id=(\d+)")
_MESH_GROUPS = re.compile(
    r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\S+)?\s*\{([^}]*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[([\d,]+)\]<=")
_EXPLICIT_GROUPS = re.compile(r"replica_groups=\{\{([\d,]+)\}")
_UNIT = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclass(frozen=True)
class Collective:
    """One kind of collective in one execution of a program's optimised HLO."""

    kind: str
    count: int
    bytes: int
    """Bytes of their results, summed (an async `-start`'s largest tuple element)."""
    received_bytes: int = 0
    """Bytes a device receives for them, summed (`received`): what the plan's network bytes
    count."""


@dataclass(frozen=True)
class Memory:
    """Per-device bytes of a compiled program, as the compiler counts them."""

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    peak_bytes: int
    """`peak_memory_in_bytes` where the compiler reports one (TPU), else arguments +
    outputs - aliased + temporaries (XLA:CPU)."""


class ProgramOutOfMemory(Exception):
    """The compiler found that a program does not fit on a device."""

    def __init__(self, program: str, needed_bytes: int | None, available_bytes: int | None,
                 message: str):
        super().__init__(f"{program}: {message}")
        self.program, self.message = program, message
        self.needed_bytes, self.available_bytes = needed_bytes, available_bytes


def memory(compiled) -> Memory:
    """Per-device memory of `compiled` (`memory_analysis()`)."""
    m = compiled.memory_analysis()
    args, out = int(m.argument_size_in_bytes), int(m.output_size_in_bytes)
    alias, temp = int(m.alias_size_in_bytes), int(m.temp_size_in_bytes)
    total = args + out - alias + temp
    peak = int(getattr(m, "peak_memory_in_bytes", 0) or 0)
    # The TPU compiler's peak is its buffer assignment's live maximum; XLA:CPU reports a
    # figure below its own temporaries there (not a peak), so the sum stands in.
    return Memory(args, out, alias, temp, peak if peak >= max(args, temp) else total)


def _cost(compiled, key: str) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float((cost or {}).get(key, 0.0))


def flops(compiled) -> float:
    """The compiler's FLOPs of `compiled` per device (every loop body counted once)."""
    return _cost(compiled, "flops")


def bytes_accessed(compiled) -> float:
    """The compiler's bytes read and written by `compiled` per device (`cost_analysis()`'s
    `bytes accessed`: every loop body counted once, both branches of a conditional)."""
    return _cost(compiled, "bytes accessed")


def _shape_bytes(text: str) -> list[int]:
    return [_DTYPE_BYTES.get(dtype, 4) * prod(int(n) for n in dims.split(",") if n)
            for dtype, dims in _SHAPE.findall(text)]


def group_size(line: str) -> int | None:
    """Devices in each replica group of a collective's HLO line (the mesh form
    `mesh['a'=2,'b'=4] {'b'}`, a `device_ids=...` order before the braces or not; the iota
    form `[groups,size]<=[n]`; explicit `{{0,1},...}`); None when the line names none
    (every device)."""
    mesh = _MESH_GROUPS.search(line)
    if mesh is not None:
        sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", mesh.group(1))}
        return prod(sizes[a] for a in re.findall(r"'([^']+)'", mesh.group(2)))
    iota = _IOTA_GROUPS.search(line)
    if iota is not None:
        return int(iota.group(1).split(",")[-1])
    explicit = _EXPLICIT_GROUPS.search(line)
    return len(explicit.group(1).split(",")) if explicit is not None else None


def received(kind: str, result_bytes: int, group: int | None) -> int:
    """Bytes a device receives for one collective whose result is `result_bytes`, over groups
    of `group` devices (bandwidth-optimal rings): an all-gather the others' (n - 1) / n of
    its result; a reduce-scatter the (n - 1) other shards of its input; an all-reduce both
    (2 (n - 1) / n); an all-to-all (n - 1) / n; a collective-permute its result. An unknown
    group counts the whole result."""
    if kind == "collective-permute" or group is None:
        return result_bytes
    n = max(group, 1)
    share = {"all-gather": (n - 1) / n, "reduce-scatter": n - 1, "all-reduce": 2 * (n - 1) / n,
             "all-to-all": (n - 1) / n}[kind]
    return int(result_bytes * share)


def collectives(hlo_text: str) -> tuple[Collective, ...]:
    """Collectives of one execution of an optimised HLO module, by kind (kinds absent: left
    out); one inside a loop body counts once per iteration (`hloflops.executions`). The
    copies of one collective that share its `channel_id` count once, as often as the most
    executed copy runs: the TPU compiler's async collective fusions repeat a collective in
    every fusion it progresses through (the v5e 2-layer train step's embedding all-gather
    sits in 16 of them: 17.9 GiB of all-gathers counted per copy, 1.3 GiB per collective)."""
    found: dict[str, list[int]] = {}
    channels: dict[tuple[str, str], tuple[int, int, int]] = {}

    def add(kind: str, times: int, moved: int, got_bytes: int) -> None:
        got = found.setdefault(kind, [0, 0, 0])
        got[0], got[1], got[2] = got[0] + times, got[1] + times * moved, got[2] + times * got_bytes

    for times, lines in executions(hlo_text).values():
        for line in lines:
            match = _OP.search(line)
            if match is None:
                continue
            kind, sizes = match.group(2), _shape_bytes(match.group(1))
            # An async start's result is (operands..., outputs...): the largest is what moves.
            moved = max(sizes) if match.group(3) else sum(sizes)
            got_bytes = received(kind, moved, group_size(line))
            channel = _CHANNEL.search(line)
            if channel is None:
                add(kind, times, moved, got_bytes)
                continue
            key = (kind, channel.group(1))
            channels[key] = (max(times, channels.get(key, (0, 0, 0))[0]), moved, got_bytes)
    for (kind, _), counted in channels.items():
        add(kind, *counted)
    return tuple(Collective(kind, *found[kind]) for kind in COLLECTIVE_KINDS if kind in found)


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNIT[unit.upper()[:1] if unit else ""])


def out_of_memory(program: str, error: Exception) -> ProgramOutOfMemory | None:
    """The compiler's out-of-memory error as `ProgramOutOfMemory`, or None for any other."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text and "Ran out of memory" not in text:
        return None
    line = next((x.strip() for x in text.splitlines() if "memory" in x.lower()),
                text.strip()[:300])
    needed = re.search(r"(?:required for [^(]*\(|Used |needs? )([\d.]+)\s*([KMGT]?)i?B?", text)
    available = re.search(r"(?:available \w+ \(|of )([\d.]+)\s*([KMGT]?)i?B?\)?\s*(?:hbm)?",
                          text[needed.end():] if needed else text)
    return ProgramOutOfMemory(program, _bytes(*needed.groups()) if needed else None,
                              _bytes(*available.groups()) if available else None, line)

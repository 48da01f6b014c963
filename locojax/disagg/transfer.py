"""Executes the plan's weight-transfer schedule: trainer slices -> Ray object store -> rollouts.

    trainer host s: flat params --cut rows [start, stop) per piece of slice s--> numpy pieces
        --ray.put--> one object per slice, keyed by `SliceKey` (bytes checked against
        plan.transfer.slices)
    driver: for round r in plan.transfer.rounds: every Send(src, dst, slice) of the round at
        once (dst fetches the object), then the next round; bytes and seconds per round
    rollout host: pieces of every slice --assemble--> full arrays --swap between generations

Slicing and assembly are plain numpy so they are testable without Ray or JAX (only the
delivery imports Ray).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from compiler.plan import TransferPlan, WeightSlice


@dataclass(frozen=True)
class SliceKey:
    """Which object in the store holds a slice of the weights: the trainer host that cut it and
    the slice's index in plan.transfer.slices."""

    src: int
    slice: int


class TransferError(RuntimeError):
    """The bytes moved differ from the plan, or a slice is missing or repeated."""


@dataclass(frozen=True)
class TransferReport:
    """What one delivery of a weights version cost."""

    version: int
    round_s: tuple[float, ...]
    round_bytes: tuple[int, ...]
    """Bytes received in each round (all its sends together)."""
    failed_hosts: tuple[int, ...]
    """Rollout hosts whose receive failed (their actor died); they get a full copy later."""

    @property
    def seconds(self) -> float:
        """All rounds, in order."""
        return float(sum(self.round_s))

    @property
    def bytes(self) -> int:
        """All rounds."""
        return int(sum(self.round_bytes))


def cut_slice(flat: dict[str, np.ndarray], ws: WeightSlice) -> list[np.ndarray]:
    """The pieces of slice `ws`: rows [start, stop) of each named parameter, contiguous."""
    pieces = [np.ascontiguousarray(flat[p.name][p.start:p.stop]) for p in ws.pieces]
    got = sum(x.nbytes for x in pieces)
    if got != ws.bytes:
        raise TransferError(f"slice {ws.index}: {got} bytes cut, the plan says {ws.bytes}")
    return pieces


def planned_round_bytes(plan: TransferPlan) -> tuple[int, ...]:
    """Bytes the plan moves in each round (sum over its sends)."""
    return tuple(sum(s.bytes for s in r) for r in plan.rounds)


class SliceAssembler:
    """Collects the slices of one weights version and fills full parameter arrays."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, np.dtype],
                 slices: tuple[WeightSlice, ...]):
        self.shapes, self.dtypes, self.slices = shapes, dtypes, slices
        self.version: int | None = None
        self._got: dict[int, list[np.ndarray]] = {}

    def add(self, version: int, index: int, pieces: list[np.ndarray]) -> int:
        """Store slice `index` of `version` (a newer version discards an older partial one)."""
        if self.version is None or version > self.version:
            self.version, self._got = version, {}
        elif version < self.version:
            return 0  # a late slice of a superseded version
        # A repeated slice (re-sent to an actor Ray may or may not have restarted) replaces
        # the first copy: both hold the same rows of the same version.
        ws = self.slices[index]
        if len(pieces) != len(ws.pieces):
            raise TransferError(f"slice {index}: {len(pieces)} pieces, the plan has "
                                f"{len(ws.pieces)}")
        self._got[index] = pieces
        return sum(x.nbytes for x in pieces)

    @property
    def complete(self) -> bool:
        """Every slice of the current version has arrived."""
        return self.version is not None and len(self._got) == len(self.slices)

    def assemble(self) -> dict[str, np.ndarray]:
        """Full arrays of the current version; every row of every parameter written once."""
        if not self.complete:
            raise TransferError(f"version {self.version}: slices {sorted(self._got)} of "
                                f"{len(self.slices)}")
        out = {n: np.empty(s, self.dtypes[n]) for n, s in self.shapes.items()}
        filled = dict.fromkeys(self.shapes, 0)
        for ws in self.slices:
            for piece, x in zip(ws.pieces, self._got[ws.index], strict=True):
                out[piece.name][piece.start:piece.stop] = x
                filled[piece.name] += piece.stop - piece.start
        short = [n for n, rows in filled.items() if rows != self.shapes[n][0]]
        if short:
            raise TransferError(f"version {self.version}: rows missing or repeated in {short}")
        return out


def deliver(plan: TransferPlan, version: int, slice_refs: dict[SliceKey, object],
            receivers: dict[int, object]) -> TransferReport:
    """Run the plan's rounds for `version`; each round waits for all of its sends."""
    import ray  # Ray: see the module docstring
    from ray.exceptions import RayActorError

    round_s, round_bytes, failed = [], [], set()
    for sends in plan.rounds:
        t0 = time.perf_counter()
        calls = [(s, receivers[s.dst].receive.remote(
                     version, s.slice, [slice_refs[SliceKey(s.src, s.slice)]]))
                 for s in sends if s.dst not in failed]
        got = 0
        for send, ref in calls:
            try:
                n = ray.get(ref)
            except RayActorError:
                failed.add(send.dst)
                continue
            if n != send.bytes:
                raise TransferError(f"version {version}: host {send.src} -> {send.dst} slice "
                                    f"{send.slice} moved {n} bytes, the plan says {send.bytes}")
            got += n
        round_s.append(time.perf_counter() - t0)
        round_bytes.append(got)
    if not failed and tuple(round_bytes) != planned_round_bytes(plan):
        raise TransferError(f"version {version}: rounds moved {round_bytes} bytes, the plan "
                            f"says {list(planned_round_bytes(plan))}")
    return TransferReport(version, tuple(round_s), tuple(round_bytes), tuple(sorted(failed)))


def deliver_all(plan: TransferPlan, version: int, slice_refs: dict[SliceKey, object],
                receiver) -> int:
    """Every slice of `version` to one (restarted) rollout actor, outside the rounds."""
    import ray  # Ray: see the module docstring

    by_slice = {key.slice: ref for key, ref in slice_refs.items()}
    return sum(ray.get([receiver.receive.remote(version, i, [by_slice[i]])
                        for i in sorted(by_slice)]))

"""Matmul FLOPs of an optimised HLO module with every loop body multiplied out.

`cost_analysis()` counts a while / scan body once. Here each computation's dot and
convolution FLOPs (2 x result elements x contracted elements) are summed, and a computation
reached from a `while` counts `known_trip_count` times (the compiler's own figure in the
while's backend config; 1 where it has none), through fusions, calls and conditionals
(every branch counted, an upper bound). Elementwise work is left out: for these programs the
matmuls are nearly all of it.
"""

from __future__ import annotations

import re
from math import prod

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")
_RESULT = re.compile(r"=\s*[a-z0-9]+\[([0-9,]*)\]")
_PARAM = re.compile(r"([\w.\-]+):\s*[a-z0-9]+\[([0-9,]*)\]")
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*[a-z0-9]+\[([0-9,]*)\]")
_CALLEE = re.compile(r"(?:calls|to_apply|body|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_BODY = re.compile(r"body=%?([\w.\-]+)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_LHS_CONTRACT = re.compile(r"lhs_contracting_dims=\{([0-9,]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=[^_]*_([0-9a-z]+)->")


def _dims(text: str) -> list[int]:
    return [int(n) for n in text.split(",") if n]


def _op_flops(line: str, shapes: dict[str, list[int]]) -> float:
    """FLOPs of one dot or convolution instruction line (0 for anything else); `shapes`:
    dims of the computation's values by name (operands print without their shapes)."""
    kind = " dot(" in line and "dot" or " convolution(" in line and "convolution"
    if not kind:
        return 0.0
    result = _RESULT.search(line)
    args = line[line.index(f" {kind}(") + len(kind) + 2:].split(")")[0]
    names = [a.strip().split(" ")[-1].lstrip("%") for a in args.split(",")]
    if result is None or len(names) < 2 or names[0] not in shapes or names[1] not in shapes:
        return 0.0
    lhs, rhs = shapes[names[0]], shapes[names[1]]
    if kind == "dot":
        contract = _LHS_CONTRACT.search(line)
        inner = prod(lhs[i] for i in _dims(contract.group(1))) if contract else 1
    else:
        labels = _DIM_LABELS.search(line)
        out = labels.group(1).index("o") if labels and "o" in labels.group(1) else -1
        inner = prod(rhs) // max(rhs[out], 1) if rhs else 1
    return 2.0 * prod(_dims(result.group(1))) * inner


def _shapes(header: str, lines: list[str]) -> dict[str, list[int]]:
    """Dims of a computation's parameters (header) and instructions, by name."""
    out = {m.group(1): _dims(m.group(2)) for m in _PARAM.finditer(header)}
    for line in lines:
        m = _DEF.match(line)
        if m:
            out[m.group(1)] = _dims(m.group(2))
    return out


def _computations(text: str) -> tuple[dict[str, list[str]], str]:
    """name -> [header, instruction lines...], and the entry's name."""
    comps: dict[str, list[str]] = {}
    entry, name = "", None
    for line in text.splitlines():
        header = _HEADER.match(line.strip())
        if header and line.rstrip().endswith("{"):
            name = header.group(1)
            comps[name] = [line]
            entry = name if line.lstrip().startswith("ENTRY") else entry
        elif name is not None:
            comps[name].append(line)
    return comps, entry


def _calls(line: str) -> list[tuple[str, int]]:
    """(callee, times per execution of this line) of one instruction line."""
    trips = _TRIPS.search(line)
    times = int(trips.group(1)) if trips and " while(" in line else 1
    body = _BODY.search(line)
    callees = _CALLEE.findall(line)
    branches = _BRANCHES.search(line)
    if branches:
        callees += [c.strip().lstrip("%") for c in branches.group(1).split(",")]
    return [(c, times if body and body.group(1) == c else 1) for c in callees]


def executions(hlo_text: str) -> dict[str, tuple[int, list[str]]]:
    """computation name -> (times it runs per execution of the module, its instruction
    lines), from the entry down (a computation called from several places: summed)."""
    comps, entry = _computations(hlo_text)
    times: dict[str, int] = {}

    def visit(name: str, n: int, depth: int = 0) -> None:
        times[name] = times.get(name, 0) + n
        if depth > 64:
            return
        for line in comps[name][1:]:
            for callee, k in _calls(line):
                if callee != name and callee in comps:
                    visit(callee, n * k, depth + 1)

    if entry:
        visit(entry, 1)
    return {name: (n, comps[name][1:]) for name, n in times.items()}


def matmul_flops(hlo_text: str) -> float:
    """Dot + convolution FLOPs of the module, loop bodies multiplied out."""
    comps, _ = _computations(hlo_text)
    total = 0.0
    for name, (n, lines) in executions(hlo_text).items():
        shapes = _shapes(comps[name][0], lines)
        total += n * sum(_op_flops(line, shapes) for line in lines)
    return total

"""Matmul FLOPs of an optimised HLO module with every loop body multiplied out.

`cost_analysis()` counts a while / scan body once. Here each computation's dot and
convolution FLOPs (2 x result elements x contracted elements) are summed, and a computation
reached from a `while` counts `known_trip_count` times (the compiler's own figure in the
while's backend config; where it has none, as in the TPU compiler's optimised loops, the
bound N of its condition `counter < constant(N)`; 1 where neither is there), through
fusions, calls and conditionals
(every branch counted, an upper bound). Elementwise work is left out: for these programs the
matmuls are nearly all of it.

A Pallas kernel is a `tpu_custom_call` whose matmuls the HLO does not show (and which
`cost_analysis()` counts as nothing unless the kernel states a cost estimate): one with a
`cost_estimate` counts its stated FLOPs; splash attention (`splash_mha_fwd`, `_dq`, `_dkv`:
`locojax.kernels.tpu_attention`) counts its matmuls from its query operand's shape and its
block sizes (`xprof_metadata`), over the (query block, key block) pairs a causal mask
leaves (the kernel skips a block the mask hides whole, and computes a partly hidden one
whole), the only mask the trainer builds: the forward 2 matmuls a pair (Q K^T, P V), the
dq kernel 3, the dkv kernel 4. Any other kernel counts 0 (the TPU decode kernel: its work
follows the slots' live columns, not its shapes).
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
_CONDITION = re.compile(r"condition=%?([\w.\-]+)")
_CONSTANT = re.compile(r"^\s*%([\w.\-]+)\s*=\s*[su]\d+\[\]\S*\s+constant\((\d+)\)")
_LESS_THAN = re.compile(r"compare\(%?[\w.\-]+,\s*%?([\w.\-]+)\),\s*direction=LT")
_LHS_CONTRACT = re.compile(r"lhs_contracting_dims=\{([0-9,]*)\}")
_CONV_LABELS = re.compile(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_ESTIMATE = re.compile(r'"cost_estimate":\{"flops":"(\d+)"')
_SPLASH = re.compile(r"^\s*(?:ROOT\s+)?%splash_m[hq]a_(fwd|dq|dkv)[\w.\-]*\s*=")
_OPERANDS = re.compile(r"operand_layout_constraints=\{(.*?)\}, frontend_attributes")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=")
_FLOAT_OPERAND = re.compile(r"\b(?:bf16|f16|f32)\[([0-9,]*)\]")
_BLOCK = re.compile(r'\\?"(block_\w+)\\?": (\d+)')
SPLASH_MATMULS = {"fwd": 2, "dq": 3, "dkv": 4}
"""Matmuls per (query block, key block) pair of each splash attention kernel."""
SPLASH_BLOCKS = {"fwd": ("block_q", "block_kv"), "dq": ("block_q_dq", "block_kv_dq"),
                 "dkv": ("block_q_dkv", "block_kv_dkv")}
"""Each kernel's (query, key) block size fields in its `xprof_metadata`."""


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
        return _conv_flops(line, lhs, rhs, _dims(result.group(1)))
    return 2.0 * prod(_dims(result.group(1))) * inner


def _conv_flops(line: str, lhs: list[int], rhs: list[int], out: list[int]) -> float:
    """A convolution's FLOPs as XLA's cost analysis counts them: 2 x output batch x output
    features x kernel input features x, per spatial dimension, the (output, window tap)
    pairs that meet a real input element (not padding, not a dilation hole). The TPU
    compiler writes batched dots as convolutions whose windows span padded or dilated
    batch dimensions, so a plain window product would over-count them."""
    labels = _CONV_LABELS.search(line)
    if not labels:
        return 2.0 * prod(out) * max(prod(rhs), 1)
    lhs_l, rhs_l, out_l = labels.groups()
    if len(lhs_l) != len(lhs) or len(rhs_l) != len(rhs) or len(out_l) != len(out):
        return 0.0
    window = _window(line, sum(c.isdigit() for c in rhs_l))
    total = 2.0 * out[out_l.index("b")] * out[out_l.index("f")] * rhs[rhs_l.index("i")]
    for k, (size, stride, pad, lhs_dilate, rhs_dilate) in enumerate(window):
        total *= _valid_taps(lhs[lhs_l.index(str(k))], out[out_l.index(str(k))], size,
                             stride, pad, lhs_dilate, rhs_dilate)
    return total


def _window(line: str, dims: int) -> list[tuple[int, int, int, int, int]]:
    """(size, stride, low padding, lhs dilation, rhs dilation) of each spatial dimension."""
    text = _WINDOW.search(line)
    fields = dict(f.split("=", 1) for f in text.group(1).split() if "=" in f) if text else {}

    def ints(key: str, default: int) -> list[int]:
        got = [int(x.split("_")[0]) for x in fields[key].split("x")] if key in fields else []
        return got or [default] * dims

    return list(zip(ints("size", 1), ints("stride", 1), ints("pad", 0), ints("lhs_dilate", 1),
                    ints("rhs_dilate", 1), strict=True))


def _valid_taps(size_in: int, size_out: int, window: int, stride: int, pad: int,
                lhs_dilate: int, rhs_dilate: int) -> int:
    """(output position, window tap) pairs of one spatial dimension that meet an input
    element: position o * stride + t * rhs_dilate - pad on the input dilated by lhs_dilate."""
    last = (size_in - 1) * lhs_dilate
    count = 0
    for t in range(window):
        c = t * rhs_dilate - pad
        if lhs_dilate == 1:  # o in [ceil(-c / stride), floor((last - c) / stride)]
            lo, hi = max(0, -(c // stride) if c < 0 else 0), min(size_out - 1, (last - c) // stride)
            count += max(0, hi - lo + 1)
        else:
            count += sum(1 for o in range(size_out)
                         if 0 <= o * stride + c <= last and (o * stride + c) % lhs_dilate == 0)
    return count


def causal_block_pairs(length: int, block_q: int, block_kv: int) -> int:
    """(query block, key block) pairs of a `length`-token causal mask that hold a visible
    score: key block j meets query block i where j * block_kv <= (i + 1) * block_q - 1."""
    keys = -(-length // block_kv)
    return sum(min(keys, ((i + 1) * block_q - 1) // block_kv + 1)
               for i in range(-(-length // block_q)))


def _splash_flops(phase: str, line: str, following: str) -> float:
    """FLOPs of one splash attention kernel call (module docstring): its first float operand
    is the query, rows... x heads x length x head_dim; block sizes from its metadata on the
    instruction's following lines (the row length where none is given)."""
    operands = _OPERANDS.search(line)
    query = _FLOAT_OPERAND.search(operands.group(1)) if operands else None
    if query is None:
        return 0.0
    *rows, heads, length, head_dim = _dims(query.group(1))
    blocks = dict((k, int(v)) for k, v in _BLOCK.findall(following))
    block_q, block_kv = (blocks.get(k, length) for k in SPLASH_BLOCKS[phase])
    pairs = causal_block_pairs(length, block_q, block_kv)
    return (2.0 * SPLASH_MATMULS[phase] * prod(rows) * heads * pairs * block_q * block_kv
            * head_dim)


def _continuation(lines: list[str], start: int) -> list[str]:
    """The lines from `start` that continue one instruction (a custom call's metadata holds
    line breaks): up to the next instruction or the computation's end."""
    out = []
    for line in lines[start:]:
        if _INSTRUCTION.match(line) or line.strip() == "}":
            break
        out.append(line)
    return out


def _kernel_flops(lines: list[str]) -> float:
    """FLOPs of the Pallas kernels (`tpu_custom_call`s) among a computation's lines (module
    docstring); an instruction's metadata may continue on the lines after it."""
    total = 0.0
    for i, line in enumerate(lines):
        if 'custom_call_target="tpu_custom_call"' not in line:
            continue
        following = "\n".join(_continuation(lines, i + 1))
        estimate = _ESTIMATE.search(line) or _ESTIMATE.search(following)
        splash = _SPLASH.match(line)
        if estimate:
            total += float(estimate.group(1))
        elif splash:
            total += _splash_flops(splash.group(1), line, following)
    return total


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


def _condition_bound(lines: list[str]) -> int | None:
    """N of a while condition whose root is `counter < constant(N)` (a scan's, a windowed
    matmul's), else None."""
    constants = {m.group(1): int(m.group(2)) for m in map(_CONSTANT.match, lines) if m}
    root = next((x for x in lines if x.lstrip().startswith("ROOT")), "")
    less = _LESS_THAN.search(root)
    return constants.get(less.group(1)) if less else None


def _trips(line: str, comps: dict[str, list[str]]) -> int:
    """Times a `while` line runs its body: `known_trip_count`, else its condition's bound."""
    trips = _TRIPS.search(line)
    if trips:
        return int(trips.group(1))
    cond = _CONDITION.search(line)
    bound = _condition_bound(comps.get(cond.group(1), [])[1:]) if cond else None
    return bound if bound is not None and bound > 0 else 1


def _calls(line: str, comps: dict[str, list[str]]) -> list[tuple[str, int]]:
    """(callee, times per execution of this line) of one instruction line."""
    times = _trips(line, comps) if " while(" in line else 1
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
            for callee, k in _calls(line, comps):
                if callee != name and callee in comps:
                    visit(callee, n * k, depth + 1)

    if entry:
        visit(entry, 1)
    return {name: (n, comps[name][1:]) for name, n in times.items()}


def matmul_flops(hlo_text: str) -> float:
    """Dot + convolution FLOPs of the module and its Pallas kernels' (module docstring), loop
    bodies multiplied out."""
    comps, _ = _computations(hlo_text)
    total = 0.0
    for name, (n, lines) in executions(hlo_text).items():
        shapes = _shapes(comps[name][0], lines)
        total += n * (sum(_op_flops(line, shapes) for line in lines) + _kernel_flops(lines))
    return total

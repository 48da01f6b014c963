"""Hashes of the rollout programs' lowered StableHLO, both programs of every benchmark case.

A change to the rollout engine that must not change what it runs (a split of `slots.py`,
names from the axis vocabulary) shows it here: hash before the change, compare after.

    .venv/bin/python scripts/rollout_hlo.py --out /tmp/rollout_hlo.json     # before
    .venv/bin/python scripts/rollout_hlo.py --compare /tmp/rollout_hlo.json # after: exit 1
                                                                            # on a difference
    [--only grouped/shared,tp2x2/chunked]

Cases (`locojax.rollout.engine.lower_programs`: the prefill lowered and compiled for its
outputs' shardings, the slot loop lowered; parameters abstract, nothing allocated):

    benchmarks/rollout.py, its model and workloads: standard at vocab 151,936 and 8,192
        (XLA's ops; the CPU kernels where they build), grouped (shared prefill; repeated),
        variable_length (16 slots, stop id biased; refill; static)
    paths the benchmark leaves out, on a small model: a bounded (chunked) prompt store
        (refill; static), the layers stacked (the accelerators' path; whole and chunked
        store), tensor-parallel meshes as the plan lays them out (replica x tensor 1x2,
        2x2 stacked, 2x2 with a chunked store)

One line per case (each program's sha256 prefix, `same`/`DIFFERS` with --compare), then a
JSON line: {"programs", "identical", "differ", "missing", "hashes"}. About two minutes on
2 cores.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from compiler.axes import LogicalAxis, MeshAxis  # noqa: E402
from compiler.vocab import KernelSwitch, RolloutSchedule  # noqa: E402
from locojax.kernels import cpu as cpu_kernels  # noqa: E402
from locojax.model import ModelArch, abstract_model, flat_params  # noqa: E402
from locojax.rollout.engine import EngineOptions, Prefill, lower_programs  # noqa: E402
from locojax.rollout.sampler import SamplingSettings  # noqa: E402
from locojax.train.sharding import param_shardings  # noqa: E402

BENCH_ARCH = dict(num_layers=4, hidden=256, num_heads=4, num_kv_heads=2, head_dim=64, ffn=768,
                  tie_embeddings=True, dtype="float32")
"""`benchmarks/rollout.py`'s model (ARCH there)."""
SMALL_ARCH = dict(num_layers=2, hidden=128, num_heads=4, num_kv_heads=2, head_dim=32, ffn=256,
                  vocab=640, dtype="float32")
"""The tensor-parallel tests' model (`tests/runtime/test_rollout_tensor.py`)."""
TENSOR_AXES = (LogicalAxis.HEADS, LogicalAxis.KV_HEADS, LogicalAxis.MLP, LogicalAxis.VOCAB)
"""Logical axes the plan's rollout specs split over `tensor`."""


@dataclass(frozen=True)
class Case:
    """One generation to lower: the workload's shapes, its options, its mesh."""

    name: str
    arch: dict
    prompts: int
    prompt_len: int
    group: int
    new_tokens: int
    options: dict = field(default_factory=dict)
    stop_id: int | None = None
    stop_bias: float = 0.0
    mesh: tuple[int, int] | None = None
    """(replicas, tensor) devices, or None: one device, no mesh."""


def cases() -> list[Case]:
    """Every case of `benchmarks/rollout.py` (sizes as there), then the paths it leaves out."""
    out = []
    for vocab in (151_936, 8_192):
        arch = BENCH_ARCH | {"vocab": vocab}
        for variant, kernels in (("xla_ops", KernelSwitch.off), ("cpu_kernels", KernelSwitch.on)):
            out.append(Case(f"standard_{vocab}/{variant}", arch, 16, 32, 1, 64,
                            {"cpu_kernels": kernels}))
    bench = BENCH_ARCH | {"vocab": 151_936}
    for prefill in Prefill:
        out.append(Case(f"grouped/{prefill}", bench, 4, 256, 8, 64, {"prefill": prefill}))
    for schedule in RolloutSchedule:
        out.append(Case(f"variable_length/{schedule}", bench, 64, 32, 1, 128,
                        {"slots": 16, "schedule": schedule}, stop_id=1, stop_bias=8.5))
    small = dict(arch=SMALL_ARCH, prompts=8, prompt_len=16, group=4, new_tokens=12, stop_id=1,
                 stop_bias=2.0)
    off = {"cpu_kernels": KernelSwitch.off}
    out += [
        Case("chunked/refill", **small, options=off | {"slots": 6, "store_prompts": 2}),
        Case("chunked/static", **small,
             options=off | {"slots": 6, "store_prompts": 2, "schedule": RolloutSchedule.static}),
        Case("stacked/whole", **small, options=off | {"slots": 6, "stacked_layers": True}),
        Case("stacked/chunked", **small,
             options=off | {"slots": 6, "store_prompts": 2, "stacked_layers": True}),
        Case("tp1x2/whole", **small, options={"slots": 5}, mesh=(1, 2)),
        Case("tp2x2/stacked", **small, options={"slots": 3, "stacked_layers": True},
             mesh=(2, 2)),
        Case("tp2x2/chunked", **small, options={"slots": 3, "store_prompts": 1}, mesh=(2, 2)),
    ]
    return out


def _on_mesh(params, mesh: Mesh):
    """Abstract params with the plan's rollout shardings: heads, kv heads, ffn and vocab split
    over `tensor`, the rest replicated."""
    specs = {name: tuple(MeshAxis.TENSOR if a in TENSOR_AXES else None
                         for a in var.get_metadata()["out_sharding"])
             for name, var in flat_params(params).items()}
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        params, param_shardings(mesh, params, specs))


def program_texts(case: Case) -> dict[str, str]:
    """{"prefill": text, "slots": text}: the lowered StableHLO of the case's two programs."""
    graphdef, params = abstract_model(ModelArch(**case.arch))
    prompt_PxW = np.random.default_rng(1).integers(
        2, case.arch["vocab"], (case.prompts, case.prompt_len)).astype(np.int32)
    len_P = np.full(case.prompts, case.prompt_len, np.int32)
    stop = case.stop_id
    settings = SamplingSettings(
        temperature=1.0, max_new_tokens=case.new_tokens,
        stop_ids=() if stop is None else (stop,),
        logit_bias=() if stop is None else ((stop, case.stop_bias),))
    mesh = None
    if case.mesh is not None:
        replicas, tensor = case.mesh
        mesh = Mesh(np.array(jax.devices()[:replicas * tensor]).reshape(replicas, tensor),
                    (MeshAxis.REPLICA, MeshAxis.TENSOR))
        params = _on_mesh(params, mesh)
    programs = lower_programs((graphdef, params), (prompt_PxW, len_P), settings,
                              group_size=case.group, mesh=mesh,
                              options=EngineOptions(**case.options))
    return {name: p.as_text() for name, p in zip(("prefill", "slots"), programs, strict=True)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the hashes here (JSON)")
    parser.add_argument("--compare", type=Path, help="compare with hashes written by --out")
    parser.add_argument("--only", default="", help="comma-separated case names")
    args = parser.parse_args()
    only = {n for n in args.only.split(",") if n}
    before = json.loads(args.compare.read_text())["hashes"] if args.compare else {}
    kernels = cpu_kernels.available()
    hashes, differ, missing = {}, [], []
    for case in cases():
        if only and case.name not in only:
            continue
        if case.options.get("cpu_kernels") == KernelSwitch.on and not kernels:
            print(f"{case.name}: skipped ({cpu_kernels.unavailable_reason()})", flush=True)
            continue
        texts = program_texts(case)
        words = []
        for program, text in texts.items():
            name = f"{case.name}:{program}"
            hashes[name] = hashlib.sha256(text.encode()).hexdigest()
            verdict = ""
            if args.compare:
                if name not in before:
                    missing.append(name)
                    verdict = " (not in the comparison file)"
                elif before[name] != hashes[name]:
                    differ.append(name)
                    verdict = " DIFFERS"
                else:
                    verdict = " same"
            words.append(f"{program} {hashes[name][:16]} ({len(text):,} chars){verdict}")
        print(f"{case.name}: " + ", ".join(words), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"jax": jax.__version__, "hashes": hashes}, indent=1))
    compared = sum(name in before for name in hashes)
    print(json.dumps({"programs": len(hashes), "compared": compared,
                      "identical": compared - len(differ), "differ": differ,
                      "missing": missing, "hashes": hashes}))
    return 1 if differ or missing else 0


if __name__ == "__main__":
    sys.exit(main())

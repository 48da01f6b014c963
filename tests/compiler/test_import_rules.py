"""The import rules of the house, checked on the source (ast), not by importing it.

Every import counts, at module level or inside a function: a lazy import that dodges a cycle
is a cycle. Packages are the rooms of `locojax/` (and the entry-point modules at its top) and
`compiler` as a whole. The allowed order, top to bottom; a package imports only packages on a
lower line, never one on its own line or above:

    locojax.__main__  locojax.plan  locojax.sample  locojax.calibrate  locojax.eval  (entries)
    locojax.launch  locojax.reports  locojax.config                      (glue)
    locojax.aot                        (the plan's programs compiled ahead of time for a slice)
    locojax.co  locojax.disagg  locojax.single           (the modes: siblings, never each other)
    locojax.runtime                                     (the step kit and what the modes share)
    locojax.train  locojax.rollout  locojax.data                         (pure JAX / Python)
    locojax.hubs                         (other packages' environments: data rows, env classes)
    locojax.model  locojax.rewards  locojax.tokenizers  locojax.kernels
    compiler                                                             (plain Python)

1. `compiler/` never imports locojax (at any level), nor jax, flax, hydra or omegaconf at
   module level.
2. Pure runtime code (locojax/model, rollout, rewards, train, data, tokenizers) never imports
   hydra, omegaconf or the compiler, except the axis vocabulary, the shared enums, the
   parameter table, the model-entry checks and the schema sections its settings take their
   defaults from (`compiler.axes`, `compiler.vocab`, `compiler.params`,
   `compiler.model_entry`: the config.json reader, `compiler.families`: the family records,
   `compiler.sections`: plain frozen
   dataclasses, so each default is written once), at any level; never `compiler.config`.
3. Every import between two packages goes down the order above.
4. No import cycle among the modules of `compiler/` and `locojax/`.
5. A module of ours is imported inside a function only where `LAZY_PROJECT_IMPORTS` says why
   (a module that loads JAX too early otherwise); third-party packages may be imported late
   where they are heavy and optional to the importer (each says why in a comment).
"""

import ast
from pathlib import Path

import pytest
from paths import ROOT

LAYERS = (
    ("locojax.__main__", "locojax.plan", "locojax.sample", "locojax.calibrate", "locojax.eval"),
    ("locojax.launch", "locojax.reports", "locojax.config"),
    ("locojax.aot",),
    ("locojax.co", "locojax.disagg", "locojax.single"),
    ("locojax.runtime",),
    ("locojax.train", "locojax.rollout", "locojax.data", "locojax.envs", "locojax.episodes"),
    ("locojax.hubs",),
    ("locojax.model", "locojax.rewards", "locojax.tokenizers", "locojax.kernels"),
    ("compiler",),
)
"""Packages from the top (entry points) down; see the module docstring."""
RANK = {pkg: rank for rank, layer in enumerate(LAYERS) for pkg in layer}
COMPILER_BANNED_AT_MODULE_LEVEL = {"jax", "jaxlib", "flax", "hydra", "omegaconf"}
RUNTIME_DIRS = ("model", "rollout", "rewards", "train", "data", "tokenizers", "kernels")
RUNTIME_BANNED = {"hydra", "omegaconf"}
RUNTIME_ALLOWED_COMPILER = {"compiler.axes", "compiler.params", "compiler.vocab",
                            "compiler.model_entry",
                            # the family records config.json is read and exported by
                            "compiler.families",
                            # the workload, algorithm and sampling sections whose defaults the
                            # runtime's settings take (defaults written once; no Hydra there)
                            "compiler.sections"}


def _imports(tree: ast.AST, module_level_only: bool) -> list[tuple[int, str]]:
    """(line, dotted name) of each import; `from a import b` yields `a.b`."""
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    if module_level_only:  # module level includes `if`/`try` blocks, not function bodies
        nodes = [n for top in tree.body for n in ast.walk(top)
                 if not isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return out


def _function_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of each import inside a function or method body (nested ones too);
    a relative import counts as ours (`.x` -> `.x`)."""
    found = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            found.update(_imports(fn, module_level_only=False))
            found.update((n.lineno, "." * n.level + (n.module or "")) for n in ast.walk(fn)
                         if isinstance(n, ast.ImportFrom) and n.level > 0)
    return sorted(found)


def _files(*parts: str) -> list[Path]:
    return sorted(ROOT.joinpath(*parts).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for top in ("compiler", "locojax") for p in _files(top)}
"""Every module of ours by dotted name (a package by its `__init__`)."""


def _resolve(name: str, modules=MODULES) -> str | None:
    """The module of ours that an imported dotted name lives in (`a.b.func` -> `a.b`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, Path] = MODULES) -> dict[str, dict[str, int]]:
    """module -> {module of ours it imports (any level): first line}."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for line, imported in _imports(ast.parse(path.read_text()), module_level_only=False):
            target = _resolve(imported, modules)
            if target is not None and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def package_of(module: str) -> str:
    """`compiler` for the compiler; `locojax.<room>` or `locojax.<entry point>` otherwise."""
    parts = module.split(".")
    return "compiler" if parts[0] == "compiler" else ".".join(parts[:2])


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str]:
    """One import cycle as [a, b, ..., a], or [] when there is none (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, {}):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def _direction_violation(src: str, dst: str) -> str | None:
    """Why an import from package `src` to package `dst` breaks the order (None: it is fine)."""
    if src == dst:
        return None
    for pkg in (src, dst):
        if pkg not in RANK:
            return f"{pkg} is not in LAYERS: add it to the order in {Path(__file__).name}"
    if RANK[src] < RANK[dst]:
        return None
    return f"{src} (layer {RANK[src]}) may not import {dst} (layer {RANK[dst]})"


LAZY_PROJECT_IMPORTS = {
    # Modules that load JAX, imported by glue that a lone process loads before it sets its CPU
    # device count (`launch.dispatch.with_cpu_devices`) and that only some paths need:
    ("locojax/launch/dispatch.py", "locojax.disagg.driver"),  # DA only
    ("locojax/launch/dispatch.py", "locojax.single.driver"),  # the single controller only
    ("locojax/launch/dispatch.py", "locojax.co.host"),  # after the device count is set
    ("locojax/launch/agree.py", "locojax.runtime.process.distributed"),  # joined processes only
    ("locojax/launch/join.py", "locojax.runtime.process.distributed"),  # joined processes only
    # The aot room's package loads JAX and the runtime; only `locojax-plan aot=true` needs it:
    ("locojax/plan.py", "locojax.aot.target"),
}
"""(file, module of ours) pairs imported inside a function, each for the reason above it."""


def lazy_project_imports() -> set[tuple[str, str]]:
    """(file, module of ours) of every import of ours inside a function body."""
    out = set()
    for path in MODULES.values():
        for _, imported in _function_imports(ast.parse(path.read_text())):
            target = _resolve(imported) if not imported.startswith(".") else imported
            if target is not None:
                out.add((str(path.relative_to(ROOT)), target))
    return out


def test_modules_of_ours_are_imported_inside_functions_only_where_the_list_says_why():
    found = lazy_project_imports()
    assert not found - LAZY_PROJECT_IMPORTS, (
        f"imported inside a function: {sorted(found - LAZY_PROJECT_IMPORTS)}; import at module "
        "level, or add the pair to LAZY_PROJECT_IMPORTS with the reason")
    assert not LAZY_PROJECT_IMPORTS - found, (
        f"no longer imported late: {sorted(LAZY_PROJECT_IMPORTS - found)}; drop them")


@pytest.mark.parametrize("path", _files("compiler"), ids=lambda p: str(p.relative_to(ROOT)))
def test_compiler_imports_no_runtime_at_module_level(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [(line, name) for line, name in _imports(tree, module_level_only=True)
           if name.split(".")[0] in COMPILER_BANNED_AT_MODULE_LEVEL]
    bad += [(line, name) for line, name in _imports(tree, module_level_only=False)
            if name.split(".")[0] == "locojax"]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def _runtime_files() -> list[Path]:
    return [p for d in RUNTIME_DIRS for p in _files("locojax", d)]


def _runtime_violation(name: str) -> bool:
    top = name.split(".")[0]
    if top in RUNTIME_BANNED:
        return True
    if top != "compiler":
        return False
    # a bare `import compiler` (or `from compiler import compile_plan`) pulls in the whole compiler
    return not any(name == ok or name.startswith(ok + ".") for ok in RUNTIME_ALLOWED_COMPILER)


@pytest.mark.parametrize("path", _runtime_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_runtime_code_imports_no_hydra_or_compiler_schema(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    names = _imports(tree, module_level_only=False)
    bad = [(line, name) for line, name in names if _runtime_violation(name)]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_every_import_between_packages_goes_down_the_order():
    bad = [f"{MODULES[src].relative_to(ROOT)}:{line} imports {dst}: {why}"
           for src, edges in import_graph().items() for dst, line in edges.items()
           if (why := _direction_violation(package_of(src), package_of(dst)))]
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    steps = [f"{a} ({MODULES[a].relative_to(ROOT)}:{graph[a][b]})"
             for a, b in zip(cycle, cycle[1:], strict=False)]
    assert not cycle, "import cycle: " + " -> ".join([*steps, cycle[-1]] if cycle else [])


MODES = ("locojax.co", "locojax.disagg", "locojax.single")
"""The mode rooms: each holds only what is particular to its mode, over the step kit."""


def test_no_mode_imports_another_mode():
    bad = [f"{MODULES[src].relative_to(ROOT)}:{line} imports {dst}"
           for src, edges in import_graph().items() for dst, line in edges.items()
           if package_of(src) in MODES and package_of(dst) in MODES
           and package_of(src) != package_of(dst)]
    assert not bad, "\n".join(bad)
    assert all(RANK[m] == RANK[MODES[0]] for m in MODES), "the modes are siblings in LAYERS"


def test_every_package_is_in_the_order():
    assert {package_of(m) for m in MODULES} - {"locojax"} <= set(RANK)


def test_the_checkers_catch_violations():
    tree = ast.parse("import jax\ndef f():\n    import hydra\nfrom compiler import config\n")
    assert [n for _, n in _imports(tree, True)] == ["jax", "compiler.config"]
    assert "hydra" in [n for _, n in _imports(tree, False)]
    assert _runtime_violation("compiler.config.Config")
    assert _runtime_violation("compiler.plan") and _runtime_violation("compiler")
    assert not _runtime_violation("compiler.axes.LogicalAxis")
    assert not _runtime_violation("compiler.sections.WorkloadConfig")
    assert _runtime_violation("compiler.config.WorkloadConfig")  # the same class, the schema's door
    assert _runtime_violation("omegaconf")
    assert _direction_violation("locojax.runtime", "locojax.launch")  # upwards
    assert _direction_violation("locojax.launch", "locojax.reports")  # sideways
    assert _direction_violation("locojax.runtime", "locojax.nowhere")  # not in the order
    assert _direction_violation("locojax.runtime", "locojax.train") is None
    assert package_of("locojax.co.host") == "locojax.co"
    assert _direction_violation("locojax.single", "locojax.disagg")  # mode to mode
    assert package_of("compiler.cost.estimate") == "compiler"
    assert _resolve("compiler.cost.estimate.estimate") == "compiler.cost.estimate"
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}, "c": {"a": 1}}) == []
    nested = ast.parse("import os\nclass A:\n    def f(self):\n        from locojax.model import x"
                       "\n        def g():\n            import jax\n            from . import y\n")
    assert _function_imports(nested) == [(4, "locojax.model.x"), (6, "jax"), (7, ".")]


def test_a_lazy_import_that_closes_a_loop_is_a_cycle(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import g\n")
    (tmp_path / "pkg" / "b.py").write_text("def g():\n    from pkg.a import x  # lazy\n")
    modules = {"pkg.a": tmp_path / "pkg" / "a.py", "pkg.b": tmp_path / "pkg" / "b.py"}
    assert find_cycle(import_graph(modules)) == ["pkg.a", "pkg.b", "pkg.a"]


TRAINING_BUILDERS = {"make_train_step", "make_sft_step", "make_logprob_fn", "init_opt_state",
                     "Checkpointer", "initial_params", "export_hf_checkpoint"}
"""What builds or saves training state: only the one trainer (and its helpers) may use them."""
TRAINER_MODULES = {"locojax/runtime/trainer.py", "locojax/runtime/train_programs.py",
                   "locojax/runtime/trained.py", "locojax/runtime/warmup.py",
                   "locojax/runtime/weights.py",
                   "locojax/runtime/rundir/checkpoint.py", "locojax/runtime/rundir/export.py",
                   "locojax/runtime/adapters.py"}
CHECKPOINT_READERS = {"locojax/eval/restore.py"}
"""Read a run's saved parameters (`Checkpointer.restore`), never build or save state."""
MODE_DRIVERS = ("locojax/co/loop.py", "locojax/disagg/actors.py", "locojax/single/worker.py")
"""CO hosts, DA trainer actors, the single controller's host workers."""


def _names_used(tree: ast.AST) -> set[str]:
    """Every bare name and attribute name in `tree` (calls, imports, references)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add(node.name.split(".")[-1])
    return out


@pytest.mark.parametrize("path", MODE_DRIVERS)
def test_every_mode_trains_through_the_one_trainer(path):
    tree = ast.parse((ROOT / path).read_text())
    imports = {name for _, name in _imports(tree, module_level_only=False)}
    assert "locojax.runtime.trainer.Trainer" in imports, f"{path} does not use the Trainer"
    assert not _names_used(tree) & TRAINING_BUILDERS, (
        f"{path} builds training state itself: {sorted(_names_used(tree) & TRAINING_BUILDERS)}")


def test_nothing_else_in_locojax_builds_training_state():
    for path in _files("locojax"):
        rel = str(path.relative_to(ROOT))
        if rel in TRAINER_MODULES or rel.startswith(("locojax/train/", "locojax/model/")):
            continue
        used = _names_used(ast.parse(path.read_text())) & TRAINING_BUILDERS
        if rel in CHECKPOINT_READERS:
            used -= {"Checkpointer"}
        assert not used, f"{rel} uses {sorted(used)}: training state belongs to the trainer"


def test_the_trainer_asks_its_split_and_tests_no_lora_condition():
    # What is trained (the whole model, or LoRA adapters on a frozen base) is
    # `runtime.trained`'s FullParams / LoraParams: the trainer names no LoRA field and stays
    # under 300 lines (issue 37).
    source = (ROOT / "locojax/runtime/trainer.py").read_text()
    lora = sorted(n for n in _names_used(ast.parse(source)) if "lora" in n.lower())
    assert not lora, f"the trainer tests LoRA itself: {lora}"
    assert len(source.splitlines()) < 300


def test_no_two_runtime_rooms_import_each_other():
    """Sub-rooms of `locojax/runtime/` (process, rundir, observe, ...) import each other one
    way only: a pair that does both is one room split in two."""
    def room(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 3 and parts[1] == "runtime" else None

    pairs = {(room(src), room(dst)) for src, edges in import_graph().items() for dst in edges
             if room(src) and room(dst) and room(src) != room(dst)}
    assert not {p for p in pairs if p[::-1] in pairs}, sorted(pairs)

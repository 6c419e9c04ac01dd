"""The layout's rules (docs/architecture.md), checked on the source: imports point downstream only,
the engine's core stays pure, only the scheduler changes its queues, the engine asks allocators for
declared abilities instead of probing them."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "kvbench"
KERNELS = ROOT / "kernels"

# What each stage may import from kvbench (besides itself). Modules at the top (cli, config,
# __main__) are the app and may import any stage.
ALLOWED_IMPORTS = {
    "core": set(),
    "kernels": set(),
    "workloads": {"core"},
    "allocators": {"core"},
    "engine": {"core", "allocators"},
    "tables": {"core", "engine"},
    "analysis": {"core"},
    "plots": {"core", "allocators", "analysis"},
    # The real executor: an edge that runs the engine's batches on a model (docs/sim_to_real.md).
    "executors": {"core", "allocators", "engine", "kernels", "referee"},
    # sim_to_vllm replays workloads on real vLLM (referee.vllm_engine).
    "tasks": {"core", "workloads", "allocators", "engine", "kernels", "tables", "analysis",
              "plots", "config", "executors", "referee"},
    # tools/bench also times vllm_v1 against the referee (--case v1_referee).
    "tools": {"core", "workloads", "allocators", "engine", "kernels", "tables", "analysis",
              "plots", "tasks", "config", "referee", "executors"},
    # The vLLM referee: an edge beside tasks/ that reads requests and specs, and prices real
    # vLLM's steps with the engine's iteration shapes (engine.simulate_v1.chunks_shape).
    "referee": {"core", "engine"},
}  # fmt: skip
# The pure middle (DESIGN.md: no file I/O, no torch, no plotting) and what it may import at all.
PURE_STAGES = ("engine", "allocators")
PURE_THIRD_PARTY = {"numpy"}
# kv_groups and kv_capacity: vLLM's KV-cache groups and their pool (paged_hybrid), arithmetic
# on specs only.
PURE_CORE = {"kvbench.core.specs", "kvbench.core.request", "kvbench.core.kv_groups",
             "kvbench.core.kv_capacity"}  # fmt: skip
# Standard-library modules that read or write files: the edges' business, not the middle's.
IO_MODULES = {"importlib", "io", "os", "pathlib", "shutil", "subprocess", "tempfile"}
SCHEDULER_QUEUES = {"waiting", "running", "swapped", "_waiting", "_running", "_swapped"}
MUTATING_METHODS = {"append", "appendleft", "extend", "extendleft", "insert", "remove", "pop",
                    "popleft", "clear", "rotate", "sort", "reverse"}  # fmt: skip


def _modules() -> list[tuple[str, Path]]:
    """(stage, path) of every module: the first folder under src/kvbench, or 'kernels'."""
    found = [("kernels", path) for path in KERNELS.rglob("*.py")]
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        found.append((parts[0] if len(parts) > 1 else path.stem, path))
    return found


def _imported_modules(tree: ast.AST) -> list[str]:
    """Absolute module names a module imports, lazily inside functions too."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def _stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "kvbench" and len(parts) > 1 else None


MODULES = _modules()


def test_every_stage_has_a_rule() -> None:
    stages = {stage for stage, path in MODULES if path.parent != PACKAGE}
    assert stages == set(ALLOWED_IMPORTS), "a new stage needs its row in ALLOWED_IMPORTS and docs"


@pytest.mark.parametrize("stage", sorted(ALLOWED_IMPORTS))
def test_imports_point_downstream(stage: str) -> None:
    wrong = []
    for module_stage, path in MODULES:
        if module_stage != stage:
            continue
        for module in _imported_modules(ast.parse(path.read_text())):
            target = _stage_of(module)
            if target is not None and target != stage and target not in ALLOWED_IMPORTS[stage]:
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("stage", PURE_STAGES)
def test_the_middle_is_pure(stage: str) -> None:
    """The engine and the allocators use the standard library, numpy and the core's records."""
    wrong = []
    for module_stage, path in MODULES:
        if module_stage != stage:
            continue
        for module in _imported_modules(ast.parse(path.read_text())):
            top = module.split(".")[0]
            if module in PURE_CORE or _stage_of(module) in PURE_STAGES:
                continue
            if top == "kvbench" or (top not in PURE_THIRD_PARTY and not _is_stdlib(top)):
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_importing_the_engine_imports_no_edge_module() -> None:
    """At run time too: in a fresh interpreter (this one has imported everything the other tests
    use), importing the engine (and ``core.specs`` through ``engine.roofline``) loads neither the
    config reader nor an edge library."""
    edge_modules = ("omegaconf", "kvbench.core.packaged_conf", "torch", "matplotlib", "pandas")
    probe = (
        "import json, sys, kvbench.engine; "
        f"print(json.dumps([name for name in {list(edge_modules)!r} if name in sys.modules]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []


def _is_stdlib(name: str) -> bool:
    return name in sys.stdlib_module_names and name not in IO_MODULES


def _queue_of(node: ast.AST) -> str | None:
    """'running' when ``node`` is ``<something>.running`` (or another scheduler queue)."""
    if isinstance(node, ast.Attribute) and node.attr in SCHEDULER_QUEUES:
        return node.attr
    return None


def _queue_mutations(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATING_METHODS
            and _queue_of(node.func.value)
        ):
            lines.append(node.lineno)
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        for target in targets:
            inner = target.value if isinstance(target, ast.Subscript) else target
            if _queue_of(inner):
                lines.append(node.lineno)
    return lines


def test_only_the_scheduler_changes_its_queues() -> None:
    # The policies: vllm_v0 (the paper's engine) and vllm_v1's step model.
    schedulers = {PACKAGE / "engine" / "scheduler.py", PACKAGE / "engine" / "scheduler_v1.py"}
    wrong = [
        f"{path.relative_to(ROOT)}:{line}"
        for _, path in MODULES
        if path not in schedulers
        for line in _queue_mutations(ast.parse(path.read_text()))
    ]
    assert not wrong, "scheduler queues changed outside engine/scheduler.py: " + ", ".join(wrong)


def test_the_check_sees_a_queue_mutation() -> None:
    """The rule above can fail: each kind of change is found."""
    for source in ("scheduler.running.append(seq)", "scheduler.waiting.appendleft(seq)",
                   "scheduler.running[0] = seq", "del scheduler.swapped[0]",
                   "scheduler.running = []"):  # fmt: skip
        assert _queue_mutations(ast.parse(source)) == [1], source
    assert _queue_mutations(ast.parse("n = len(scheduler.running)")) == []


def _declared_abilities() -> set[str]:
    """The protocols ``kvbench.allocators.base`` declares (the allocator and its abilities)."""
    tree = ast.parse((PACKAGE / "allocators" / "base.py").read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and any(ast.unparse(b) == "Protocol" for b in node.bases)
    }


def test_the_engine_probes_no_allocator() -> None:
    """Optional abilities are declared protocols (``kvbench.allocators.base``): the engine checks
    those, never an attribute by name or a concrete allocator class."""
    abilities = _declared_abilities()
    assert {"Allocator", "CohortAllocator", "CopyOnWriteCounter"} <= abilities
    wrong = []
    for stage, path in MODULES:
        if stage != "engine":
            continue
        tree = ast.parse(path.read_text())
        allocator_names = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and _stage_of(node.module or "") == "allocators"
            for alias in node.names
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in ("getattr", "hasattr"):
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.id}")
                if node.func.id == "isinstance" and len(node.args) == 2:
                    checked = ast.unparse(node.args[1])
                    if checked in allocator_names - abilities:
                        wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} isinstance")
    assert not wrong, "\n".join(wrong)

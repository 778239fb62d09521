"""The shape of the package: which package may import which (one table, docs/reference/layout.md draws
it), no import cycles, only `run/` uses Ray, and validating or planning a pipeline imports neither torch
nor TRL (that is what keeps them fast)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "align"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports(name: str) -> set[str]:
    """Every align module `name` imports, at module level, inside a function or for type checking only (a
    lazy or annotation-only import is still a dependency), resolved to modules: `from align.backends
    import fsdp` is align.backends.fsdp."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("align")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("align"):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in MODULES else node.module)
    return {module for module in found if module in MODULES and module != name}


GRAPH = {name: imports(name) for name in MODULES}

# The flow, lowest first: what each package (or top-level module) of align may import besides itself.
BASE = {"errors", "cache", "fingerprint"}
MAY_IMPORT: dict[str, set[str]] = {
    "errors": set(),
    "cache": set(),
    "fingerprint": set(),
    "rewards": {"errors"},
    "records": {"errors"},
    "compat": {"errors"},  # every use of another library's private code (tests/test_compat.py)
    "measures": set(),
    "trainers": {"compat"},
    "models": BASE,
    "data": BASE | {"compat"},
    "config": BASE | {"models", "rewards"},
    "backends": BASE | {"compat", "config", "models"},
    "pipeline": BASE | {"config", "backends", "data", "models", "rewards"},
    "planning": BASE | {"config", "backends", "pipeline", "data", "models"},
    "stages": BASE
    | {"config", "backends", "pipeline", "planning", "data", "models", "measures", "records", "rewards"}
    | {"compat", "trainers"},
    "run": BASE | {"compat", "config", "pipeline", "planning", "data", "models", "records", "stages"},
    "report": BASE | {"config", "pipeline", "planning", "data", "models", "records", "stages", "run"},
    "cli": BASE | {"config", "pipeline", "planning", "data", "models", "run", "report"},
}


def package_of(module: str) -> str:
    return module.split(".")[1] if module != "align" else "align"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return stack[stack.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle_and_passes_a_tree() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_align_has_no_import_cycles() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_package_and_top_level_module_is_in_the_table() -> None:
    found = {package_of(name) for name in MODULES} - {"align", "__init__"}
    assert found == set(MAY_IMPORT), f"add to MAY_IMPORT: {sorted(found - set(MAY_IMPORT))}"


def test_every_import_goes_down_the_table() -> None:
    """Each import between packages is one the table allows, so the flow only runs one way."""
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        for target in targets
        if package_of(name) != package_of(target)
        and package_of(target) not in MAY_IMPORT.get(package_of(name), set())
        and package_of(name) != "align"
    )
    assert wrong == []


def test_the_table_has_no_circle() -> None:
    assert find_cycle({name: allowed for name, allowed in MAY_IMPORT.items()}) is None


def test_align_keeps_few_top_level_modules() -> None:
    assert len(list(PACKAGE.glob("*.py"))) <= 6, sorted(path.name for path in PACKAGE.glob("*.py"))


def test_stages_never_import_the_driver() -> None:
    offenders = {
        name: sorted(target for target in targets if target.startswith("align.run"))
        for name, targets in GRAPH.items()
        if name.startswith(("align.stages", "align.backends", "align.trainers"))
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_only_the_driver_imports_ray() -> None:
    users = sorted(
        name
        for name, path in MODULES.items()
        if "import ray" in path.read_text() or "from ray" in path.read_text()
    )
    assert all(name.startswith("align.run") or name == "align.compat.ray" for name in users), users
    ray_touches = sorted(name for name, targets in GRAPH.items() if "align.compat.ray" in targets)
    assert all(name.startswith("align.run") for name in ray_touches), ray_touches


def test_validate_and_plan_import_neither_torch_nor_trl(tmp_path: Path) -> None:
    """Validating and planning a pipeline (its `trl:` blocks checked once before) stays free of the heavy
    libraries; the first check of a new block imports TRL and caches its verdict."""
    code = (
        "import sys; from align.cli import main\n"
        "assert main(['validate', 'pipelines/tiny_sft_rm_ppo.yaml']) == 0\n"
        "assert main(['plan', 'pipelines/ppo_llama3.yaml', '--device-memory', '80GB']) == 0\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'trl', 'datasets', 'ray') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    env = {"ALIGN_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    for attempt in ("cold", "warm"):
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent, env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        heavy = done.stdout.strip().splitlines()[-1]
        if attempt == "warm":
            assert heavy == "HEAVY []", heavy

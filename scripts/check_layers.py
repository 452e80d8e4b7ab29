"""Check that every import of memr1 points down the layers of docs/architecture.md.

    python scripts/check_layers.py          # prints each upward import and import cycle; exit 1 if any

Every import counts, the lazy ones inside functions too: a lazy import hides a cycle from Python,
not from a reader. A module's layer is the first entry of LAYERS that its dotted name starts with;
a module may import its own layer and the layers below it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("memr1",)

# Bottom to top. Same-layer imports are allowed (a cycle among them is still reported).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("memr1.types", "memr1.interrupt", "memr1.config", "memr1.timing", "memr1.progress", "memr1.quiet", "memr1.seeds", "memr1.shipped", "memr1.faults", "memr1.lightning_loop", "memr1.provenance")),
    ("data", ("memr1.datasets",)),
    ("models", ("memr1.llm", "memr1.embed")),
    ("metrics", ("memr1.metrics",)),
    ("memory", ("memr1.memory",)),
    ("agents", ("memr1.agents",)),
    ("banks", ("memr1.banks",)),
    ("environments", ("memr1.envs",)),
    ("rl maths", ("memr1.rl",)),
    ("states", ("memr1.states",)),
    ("training parts", ("memr1.teachers", "memr1.search_teacher", "memr1.modules", "memr1.callbacks")),
    ("factories", ("memr1.factories", "memr1.preflight")),
    ("lightning data", ("memr1.data_modules",)),
    ("applications", ("memr1.evaluation", "memr1.pipeline", "memr1.stage_archive", "memr1.training", "memr1.service")),
    ("commands", ("memr1.schedule", "memr1.cli", "memr1.apps", "memr1")),
]


def layer_of(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return index
    raise ValueError(f"{module}: in no layer of scripts/check_layers.py LAYERS; add it there and to docs/architecture.md")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports (resolved to the longest known module name)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    found = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}
    known = set(files)
    return {name: imported_modules(path, known) - {name} for name, path in files.items()}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if target == "memr1" or module.startswith(target + "."):
                continue  # a package's own __init__ (lazy attribute access) is not a dependency
            if layer_of(target) > layer_of(module):
                problems.append(
                    f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
                )
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def package_of(module: str) -> str:
    """The unit a reader thinks in: memr1's subpackage or top-level module."""
    return ".".join(module.split(".")[:2]) if module.startswith("memr1.") else module.split(".")[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """`graph` between packages (`package_of`): a cycle here is two packages that import each other."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = package_of(module)
        packages.setdefault(source, set()).update(package_of(t) for t in targets if package_of(t) != source)
    return packages


def main() -> int:
    graph = import_graph()
    # The package __init__ re-exports (memr1.memory -> memr1.memory.bank) are not cycles of meaning.
    graph_without_inits = {
        module: {t for t in targets if not module.startswith(t + ".") and t != "memr1"} for module, targets in graph.items()
    }
    upward = upward_imports(graph)
    found = cycles(graph_without_inits) + cycles(package_graph(graph_without_inits))
    for line in upward:
        print(f"upward import: {line}")
    for component in found:
        print(f"import cycle: {' <-> '.join(component)}")
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports: {len(upward)} upward, {len(found)} cycle(s)")
    return 1 if upward or found else 0


if __name__ == "__main__":
    sys.exit(main())

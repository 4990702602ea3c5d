"""No package in this repository has an import cycle, counting every import a module can run.

The graph is built from the source with ``ast`` (nothing is imported): every ``import`` and
``from ... import`` anywhere in a module counts, including lazy imports inside functions, imports
under ``if TYPE_CHECKING:`` and ``importlib.import_module("literal")``. Relative imports are
resolved; ``from pkg import name`` depends on the submodule ``pkg.name`` when that is a module and
on ``pkg`` (its ``__init__``) otherwise, so a re-export through a package ``__init__`` is an edge
to that ``__init__``. Strongly connected components (Tarjan, iterative) of more than one module are
cycles; each is reported with one concrete path whose every step names the file:line of the import.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = (
    "core/src",
    "sandbox/src",
    "trainers/src",
    "tinker/src",
    "viewer/src",
    "plugins/*/src",
    "examples/reverse_text/src",
)


@dataclass(frozen=True)
class Module:
    name: str
    path: Path

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: Path
    line: int


def discover_modules(roots: list[Path]) -> dict[str, Module]:
    """Every module under the given source roots, keyed by dotted name."""
    modules: dict[str, Module] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if not parts:
                continue
            name = ".".join(parts)
            if name in modules:
                raise AssertionError(f"module {name} is defined twice: {modules[name].path} and {path}")
            modules[name] = Module(name, path)
    return modules


def _known_prefix(dotted: str, modules: dict[str, Module]) -> str | None:
    """The longest prefix of `dotted` that is a module of ours (None for third-party/stdlib)."""
    while dotted:
        if dotted in modules:
            return dotted
        dotted = dotted.rpartition(".")[0]
    return None


def _resolve_relative(module: Module, level: int, name: str | None) -> str:
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        raise AssertionError(f"{module.path}: relative import beyond the top-level package")
    parts = parts[: len(parts) - (level - 1)]
    if name:
        parts.append(name)
    return ".".join(parts)


def _import_targets(node: ast.AST, module: Module, modules: dict[str, Module]) -> list[str]:
    """The modules of ours that one AST node imports (empty for any other node)."""
    targets: list[str | None] = []
    if isinstance(node, ast.Import):
        targets = [_known_prefix(alias.name, modules) for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = _resolve_relative(module, node.level, node.module) if node.level else (node.module or "")
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            targets.append(submodule if alias.name != "*" and submodule in modules else _known_prefix(base, modules))
    elif (
        isinstance(node, ast.Call)
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
        and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            or (isinstance(node.func, ast.Name) and node.func.id in {"import_module", "__import__"})
        )
    ):
        targets = [_known_prefix(node.args[0].value, modules)]
    return [t for t in targets if t is not None and t != module.name]


def collect_edges(modules: dict[str, Module]) -> dict[str, dict[str, Edge]]:
    """module -> {imported module -> the first import of it (by line)}; every import anywhere in the file."""
    graph: dict[str, dict[str, Edge]] = {name: {} for name in modules}
    for module in modules.values():
        tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
        for node in ast.walk(tree):
            for target in _import_targets(node, module, modules):
                edge = Edge(module.name, target, module.path, node.lineno)
                known = graph[module.name].get(target)
                if known is None or edge.line < known.line:
                    graph[module.name][target] = edge
    return graph


def strongly_connected_components(graph: dict[str, dict[str, Edge]]) -> list[list[str]]:
    """Tarjan's algorithm without recursion; only components of two or more modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = []
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, sorted(graph[start])))
        while work:
            node, pending = work[-1]
            if pending:
                child = pending.pop(0)
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, sorted(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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
    return sorted(components)


def cycle_path(component: list[str], graph: dict[str, dict[str, Edge]]) -> list[Edge]:
    """A shortest cycle through the component's first module, staying inside the component."""
    members = set(component)
    start = component[0]
    came_from: dict[str, Edge] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph[node]):
            if target not in members:
                continue
            edge = graph[node][target]
            if target == start:
                path = [edge]
                while path[0].source != start:
                    path.insert(0, came_from[path[0].source])
                return path
            if target not in came_from:
                came_from[target] = edge
                queue.append(target)
    raise AssertionError(f"no cycle through {start} in component {component}")


def describe_cycles(graph: dict[str, dict[str, Edge]], base: Path) -> list[str]:
    """One message per cycle: its modules, then a concrete path with file:line of each import."""
    messages = []
    for component in strongly_connected_components(graph):
        path = cycle_path(component, graph)
        chain = " -> ".join([edge.source for edge in path] + [path[0].source])
        steps = "\n".join(
            f"    {edge.source} -> {edge.target}  ({_display(edge.path, base)}:{edge.line})" for edge in path
        )
        messages.append(f"cycle among {len(component)} modules {component}:\n  {chain}\n{steps}")
    return messages


def _display(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def find_cycles(roots: list[Path], base: Path) -> list[str]:
    return describe_cycles(collect_edges(discover_modules(roots)), base)


def repository_roots() -> list[Path]:
    roots = sorted(path for pattern in SOURCE_ROOTS for path in REPO.glob(pattern) if path.is_dir())
    return roots


def test_source_roots_are_found():
    roots = repository_roots()
    names = {str(root.relative_to(REPO)) for root in roots}
    assert {"core/src", "sandbox/src", "trainers/src", "tinker/src", "viewer/src"} <= names
    assert any(name.startswith("plugins/") for name in names)
    modules = discover_modules(roots)
    assert {"skyrl_core", "skyrl_sandbox", "skyrl_trainers"} <= set(modules)


def test_no_import_cycles():
    cycles = find_cycles(repository_roots(), REPO)
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(cycles)


# The checker itself: a fixture package with a cycle must be reported, one without must not.

FIXTURE_VARIANTS = {
    "lazy": {
        "__init__.py": "",
        "a.py": "from fixpkg import b\n",
        "b.py": "def later():\n    from fixpkg.a import thing\n    return thing\n",
    },
    "type_checking": {
        "__init__.py": "",
        "a.py": "from .b import B\n\nthing = 1\n",
        "b.py": (
            "from typing import TYPE_CHECKING\n\n"
            "if TYPE_CHECKING:\n    from .a import thing\n\n"
            "class B:\n    pass\n"
        ),
    },
    "through_package_init": {
        "__init__.py": "from fixpkg.sub.leaf import Leaf\n\n\ndef helper():\n    pass\n",
        "sub/__init__.py": "",
        "sub/leaf.py": "def make():\n    from .. import helper\n\nclass Leaf:\n    pass\n",
    },
    "name_from_init": {
        "__init__.py": "from .a import A\n",
        "a.py": "import fixpkg.b\n\nclass A:\n    pass\n",
        "b.py": "from fixpkg import A\n",
    },
    "import_module": {
        "__init__.py": "",
        "a.py": "import importlib\n\ndef load():\n    return importlib.import_module('fixpkg.b')\n",
        "b.py": "import fixpkg.a\n",
    },
}


def _write_package(root: Path, files: dict[str, str]) -> Path:
    src = root / "src"
    for relative, text in files.items():
        path = src / "fixpkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return src


@pytest.mark.parametrize("variant", sorted(FIXTURE_VARIANTS))
def test_checker_reports_a_cycle(tmp_path, variant):
    src = _write_package(tmp_path, FIXTURE_VARIANTS[variant])
    cycles = find_cycles([src], tmp_path)
    assert len(cycles) == 1, cycles
    message = cycles[0]
    assert " -> " in message
    assert "src/fixpkg/" in message
    # every step of the path names the importing file and a line number
    steps = [line for line in message.splitlines() if line.startswith("    ")]
    assert steps and all(".py:" in step for step in steps)
    # the path closes on itself
    chain = message.splitlines()[1].strip().split(" -> ")
    assert chain[0] == chain[-1]


def test_checker_reports_exact_path_with_lines(tmp_path):
    src = _write_package(tmp_path, FIXTURE_VARIANTS["lazy"])
    (cycle,) = find_cycles([src], tmp_path)
    assert "fixpkg.a -> fixpkg.b -> fixpkg.a" in cycle
    assert "fixpkg.a -> fixpkg.b  (src/fixpkg/a.py:1)" in cycle
    assert "fixpkg.b -> fixpkg.a  (src/fixpkg/b.py:2)" in cycle


def test_checker_accepts_a_tree(tmp_path):
    src = _write_package(
        tmp_path,
        {
            "__init__.py": "from .a import A\nfrom .b import B\n",
            "types.py": "class Shared:\n    pass\n",
            "a.py": "from .types import Shared\n\nclass A(Shared):\n    pass\n",
            "b.py": "def f():\n    from fixpkg.a import A\n    from fixpkg import types\n\nclass B:\n    pass\n",
        },
    )
    assert find_cycles([src], tmp_path) == []


def test_checker_finds_separate_cycles(tmp_path):
    src = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from . import b\n",
            "b.py": "from . import a\n",
            "c.py": "from . import d\n",
            "d.py": "def f():\n    from . import e\n",
            "e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import X\n",
        },
    )
    cycles = find_cycles([src], tmp_path)
    assert len(cycles) == 2
    assert "fixpkg.a -> fixpkg.b -> fixpkg.a" in cycles[0]
    assert "fixpkg.c -> fixpkg.d -> fixpkg.e -> fixpkg.c" in cycles[1]

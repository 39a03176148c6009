"""``polar/`` is layered: each top-level package imports only from its own layer or the ones below, the packages'
imports form no cycle, nor do the modules', and nothing in ``polar/`` imports the web or worker frameworks.

Every import counts, including those inside functions and under ``TYPE_CHECKING``: a deferred import is still a
dependency a reader has to follow. A new top-level package has to be placed in ``LAYERS`` before it can land."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

import polar
from tests.polar.conftest import write_tree

# The layers, lowest first; a package may import from its own layer and the layers before it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "clock"),  # the ground floor: nothing of polar below it
    ("codec",),  # JSON bodies, HTTP/1.1 requests, small net helpers, import paths, stack identity
    ("contract",),  # the task request, session states, stages, engine addresses, callback targets, proxy routes
    ("config",),
    ("chat",),  # conversation, completion parsing, chat templates, tokenizers: the proxy's and every engine's
    ("refengine",),  # the reference engine: server, policies, the torch and vLLM backends
    ("storage",),
    ("protocols", "reconstruction"),
    ("runtimes",),
    ("harbor",),
    ("harnesses",),
    ("evaluators",),
    ("records",),
    ("services",),
    ("lifecycle",),
    ("observability",),
    ("fleet",),  # the engine fleet: addresses, health, load, pins, pause and sync state
    ("proxy", "training"),
    ("stages", "inspection"),
    ("batches",),  # use cases over stages and training: cancelling a batch
    ("loaders", "gym", "integrations", "agents", "datasets", "client"),
    ("local",),  # the CLI, the launcher, embedded mode, the demo, harness checks
    ("__main__",),
)

FORBIDDEN = {"flask", "celery", "gunicorn", "kombu", "werkzeug", "web", "workers"}
ROOT = Path(polar.__file__).parent


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, name: str) -> Iterator[tuple[str, tuple[str, ...]]]:
    """``(module, names)`` for each import in ``path``; relative imports made absolute."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                yield ".".join([*base, *([node.module] if node.module else [])]), tuple(a.name for a in node.names)
            else:
                yield node.module or "", tuple(a.name for a in node.names)


def module_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package at ``root`` to the modules of that package it imports.

    ``from package import name`` leads to ``package.name`` where that is a module, else to ``package``."""
    paths = {module_name(path, root): path for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets = graph.setdefault(name, set())
        for module, names in imported_names(path, name):
            if module.split(".")[0] != root.name:
                continue
            submodules = [f"{module}.{n}" for n in names if f"{module}.{n}" in paths]
            if submodules and len(submodules) == len(names):
                targets.update(submodules)
                continue
            targets.update(submodules)
            while module not in paths and "." in module:
                module = module.rpartition(".")[0]
            if module in paths and module != name:
                targets.add(module)
    return graph


def top_level(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def package_graph(modules: Mapping[str, set[str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for importer, targets in modules.items():
        if not top_level(importer):
            continue
        edges = graph.setdefault(top_level(importer), set())
        edges.update(top_level(t) for t in targets if top_level(t) and top_level(t) != top_level(importer))
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def upward_imports(modules: Mapping[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    rank = {name: position for position, layer in enumerate(layers) for name in layer}
    found = []
    for importer, targets in sorted(modules.items()):
        for target in sorted(targets):
            low, high = top_level(importer), top_level(target)
            if low and high and low != high and rank[high] > rank[low]:
                found.append(f"{importer} -> {target}")
    return found


def test_every_package_has_a_layer() -> None:
    placed = {name for layer in LAYERS for name in layer}
    present = {top_level(module) for module in module_graph(ROOT)} - {""}
    assert sorted(present - placed) == []
    assert sorted(placed - present) == []


def test_no_import_runs_up_a_layer() -> None:
    assert upward_imports(module_graph(ROOT), LAYERS) == []


def test_packages_form_no_cycle() -> None:
    assert cycles(package_graph(module_graph(ROOT))) == []


def test_modules_form_no_cycle() -> None:
    assert cycles(module_graph(ROOT)) == []


def test_polar_imports_no_framework() -> None:
    offenders = [
        f"{path}: {module}"
        for path in ROOT.rglob("*.py")
        for module, _ in imported_names(path, module_name(path, ROOT))
        if module.split(".")[0] in FORBIDDEN
    ]
    assert offenders == []


@pytest.fixture
def scratch_package(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "polar", {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "from polar.high import b\n",
        "high/__init__.py": "",
        "high/b.py": "from polar.low.a import thing\n",
    })  # fmt: skip


def test_the_checks_see_a_cycle_and_an_upward_import(scratch_package: Path) -> None:
    modules = module_graph(scratch_package)
    assert upward_imports(modules, (("low",), ("high",))) == ["polar.low.a -> polar.high.b"]
    assert cycles(package_graph(modules)) == [["high", "low"]]
    assert cycles(modules) == [["polar.high.b", "polar.low.a"]]

"""The import graph keeps its shape (docs/architecture.md, "Dependency direction").

The contracts live in pyproject.toml (`[tool.importlinter]`) and are checked here with
import-linter. Import-linter checks layers, not circles within a layer, so the circles are
found here over grimp's graph of every module, lazy imports inside functions included.
The last two tests show that both checks fail on a graph that breaks them.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import grimp
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, under its older name
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    sys.path.insert(0, str(ROOT))
    try:
        return grimp.build_graph(*CONFIG["root_packages"], cache_dir=None)
    finally:
        sys.path.remove(str(ROOT))


def circles(graph: grimp.ImportGraph, modules: Iterable[str] | None = None) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(modules or graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            nxt = next(successors, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
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
                    found.append(sorted(component))
    return found


def package_graph(graph: grimp.ImportGraph) -> grimp.ImportGraph:
    """The same imports between top-level packages only."""
    packages = grimp.ImportGraph()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = module.split(".")[0], imported.split(".")[0]
            if a != b:
                packages.add_import(importer=a, imported=b)
    return packages


def test_every_import_linter_contract_is_kept() -> None:
    # in a process of its own: import-linter reconfigures logging, which other tests read
    run = [
        sys.executable,
        "-c",
        "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(no_cache=True, no_logo=True))",
    ]
    done = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_module_imports_itself_round_a_circle(graph: grimp.ImportGraph) -> None:
    assert circles(graph) == []


def test_no_package_imports_itself_round_a_circle(graph: grimp.ImportGraph) -> None:
    assert circles(package_graph(graph)) == []


def test_an_upward_import_breaks_the_layers(graph: grimp.ImportGraph) -> None:
    graph.add_import(importer="schemas.tickets", imported="agents.engine")
    try:
        illegal = graph.find_illegal_dependencies_for_layers(
            layers=("agents", "streams", "schemas"), containers=set()
        )
        assert any(d.importer == "schemas" and d.imported == "agents" for d in illegal)
    finally:
        graph.remove_import(importer="schemas.tickets", imported="agents.engine")


def test_a_circle_is_found() -> None:
    g = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        g.add_import(importer=a, imported=b)
    assert circles(g) == [["p.a", "p.b", "p.c"]]

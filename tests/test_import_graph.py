"""The import graphs of ``llama_cpp`` and ``build_tools`` have no cycles, and nothing shipped or
released imports the test suite.

Every ``import`` statement counts, function-local ones included: a cycle that only closes at call
time is still a cycle in the design. Imports under ``if TYPE_CHECKING:`` do not run and do not
count. ``from . import x`` is an edge to the submodule ``x`` when there is one, else to the
package's ``__init__``. Importing a submodule implicitly runs its parent package's ``__init__``;
that implicit edge is not counted (it would make every re-exporting ``__init__`` a cycle).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("llama_cpp", "build_tools")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str  # path:line


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path, package: str) -> dict[str, Path]:
    return {_module_name(root, p): p for p in sorted((root / package).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, skipping the bodies of ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a known module (``a.b.c`` may name an attribute)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def edges(root: Path, known: dict[str, Path], module: str, path: Path) -> Iterator[Edge | tuple[str, str]]:
    """Edges from ``module`` to known modules, and ``("external", name)`` for the rest."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in _imports(tree):
        where = f"{path.relative_to(root)}:{node.lineno}"
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
        for name in names:
            target = _resolve(name, known)
            if target is None:
                yield ("external", name)
            elif target != module:
                yield Edge(module, target, where)


def graph(root: Path, packages: tuple[str, ...]) -> tuple[dict[str, list[Edge]], list[tuple[str, str, str]]]:
    """Internal edges per module, and ``(module, imported name, where)`` for every external import."""
    known: dict[str, Path] = {}
    for package in packages:
        known.update(_modules(root, package))
    out: dict[str, list[Edge]] = {m: [] for m in known}
    external: list[tuple[str, str, str]] = []
    for module, path in known.items():
        for e in edges(root, known, module, path):
            if isinstance(e, Edge):
                out[module].append(e)
            else:
                external.append((module, e[1], str(path.relative_to(root))))
    return out, external


def cycles(g: dict[str, list[Edge]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in g:
        if start in index:
            continue
        work: list[tuple[str, Iterator[Edge]]] = [(start, iter(g[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for e in it:
                if e.target not in index:
                    index[e.target] = low[e.target] = counter
                    counter += 1
                    stack.append(e.target)
                    on_stack.add(e.target)
                    work.append((e.target, iter(g[e.target])))
                    advanced = True
                    break
                if e.target in on_stack:
                    low[node] = min(low[node], index[e.target])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(g: dict[str, list[Edge]], component: list[str]) -> str:
    members = set(component)
    inner = sorted({f"    {e.source} -> {e.target} ({e.where})" for m in component for e in g[m]
                    if e.target in members})
    return "cycle among " + ", ".join(component) + ":\n" + "\n".join(inner)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package: str) -> None:
    g, _ = graph(REPO, (package,))
    found = cycles(g)
    assert not found, "\n".join(_describe(g, c) for c in found)


def test_build_tools_and_package_never_import_tests() -> None:
    g, external = graph(REPO, PACKAGES)
    bad = {f"{where}: {module} imports {name}" for module, name, where in external
           if name == "tests" or name.startswith("tests.")}
    bad |= {f"{e.where}: {e.source} imports {e.target}" for es in g.values() for e in es
            if e.source.startswith("llama_cpp") and e.target.startswith("build_tools")}
    assert not bad, "\n".join(sorted(bad))


def test_checker_finds_cycles_and_test_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import A\n")
    (pkg / "a.py").write_text("A = 1\ndef f():\n    from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a\nimport tests.fixtures\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    g, external = graph(tmp_path, ("pkg",))
    assert cycles(g) == [["pkg.a", "pkg.sub.b"]]  # the function-local import closes it
    assert not g["pkg.c"]  # TYPE_CHECKING imports do not run
    assert ("pkg.sub.b", "tests.fixtures", "pkg/sub/b.py") in external

"""The import graphs of ``llama_cpp`` and ``build_tools`` have no cycles, ``llama_cpp`` imports
only downwards through its declared layers (:data:`LAYERS`), and nothing shipped or released
imports the test suite.

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

REPO = Path(__file__).resolve().parents[2]
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


def _imports(tree: ast.AST, type_checking: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, skipping the bodies of ``if TYPE_CHECKING:`` unless ``type_checking``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if not type_checking and isinstance(node, ast.If) and _is_type_checking(node.test):
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


def edges(root: Path, known: dict[str, Path], module: str, path: Path,
          type_checking: bool = False) -> Iterator[Edge | tuple[str, str]]:
    """Edges from ``module`` to known modules, and ``("external", name)`` for the rest."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in _imports(tree, type_checking):
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


def graph(root: Path, packages: tuple[str, ...],
          type_checking: bool = False) -> tuple[dict[str, list[Edge]], list[tuple[str, str, str]]]:
    """Internal edges per module, and ``(module, imported name, where)`` for every external import
    (``type_checking``: imports under ``if TYPE_CHECKING:`` count too)."""
    known: dict[str, Path] = {}
    for package in packages:
        known.update(_modules(root, package))
    out: dict[str, list[Edge]] = {m: [] for m in known}
    external: list[tuple[str, str, str]] = []
    for module, path in known.items():
        for e in edges(root, known, module, path, type_checking):
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


@pytest.mark.parametrize("type_checking", [False, True], ids=["runtime", "type-checking"])
@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package: str, type_checking: bool) -> None:
    """No cycle at run time, and none either once the ``TYPE_CHECKING`` imports are counted."""
    g, _ = graph(REPO, (package,), type_checking)
    found = cycles(g)
    assert not found, "\n".join(_describe(g, c) for c in found)


# The layers of ``llama_cpp``, bottom first: a module imports its own layer and the ones below,
# never one above (an import cycle inside a layer is still caught by test_no_import_cycles). A
# module's layer is that of the longest prefix listed; ``llama_cpp`` itself is the lazy facade.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("native", ("llama_cpp.llama_cpp", "llama_cpp.ggml_cpp", "llama_cpp.mtmd_cpp", "llama_cpp._native",
                "llama_cpp._errors", "llama_cpp._version", "llama_cpp.llama_types")),
    ("core", ("llama_cpp._safety", "llama_cpp._core", "llama_cpp._internals", "llama_cpp._compat",
              "llama_cpp.llama_batch", "llama_cpp.llama_tokenizer")),
    ("features", ("llama_cpp._grammar", "llama_cpp.llama_grammar", "llama_cpp._generation", "llama_cpp._chat",
                  "llama_cpp._placement",
                  "llama_cpp.llama_cache", "llama_cpp.speculative", "llama_cpp.llama_speculative")),
    ("multimodal", ("llama_cpp.mtmd", "llama_cpp.mtmd_chat", "llama_cpp._multimodal", "llama_cpp.llama_embedding")),
    ("facades", ("llama_cpp", "llama_cpp.llama", "llama_cpp.llama_worker", "llama_cpp.llama_chat_format",
                 "llama_cpp.server",
                 "llama_cpp.cli", "llama_cpp.__main__")),
)


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (KeyError for a module no layer lists)."""
    best: tuple[int, int] | None = None
    for i, (_name, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    if best is None:
        raise KeyError(module)
    return best[0]


def test_every_module_has_a_layer() -> None:
    g, _ = graph(REPO, ("llama_cpp",))
    missing = []
    for m in g:
        try:
            layer_of(m)
        except KeyError:
            missing.append(m)
    assert not missing, f"add these modules to LAYERS: {missing}"


def test_imports_go_down_the_layers() -> None:
    """Function-local and ``TYPE_CHECKING`` imports included: an upward edge is a design error
    even when it only runs late."""
    g, _ = graph(REPO, ("llama_cpp",), type_checking=True)
    up = sorted(f"{e.where}: {e.source} ({LAYERS[layer_of(e.source)][0]}) imports {e.target} "
                f"({LAYERS[layer_of(e.target)][0]})"
                for es in g.values() for e in es if layer_of(e.target) > layer_of(e.source))
    assert not up, "\n".join(up)


# Lazy ``__init__`` modules that resolve names on first use: the only places a module is named by
# a string (anywhere else a string import hides an edge from these tests).
STRING_IMPORTS_ALLOWED = frozenset({"llama_cpp/__init__.py", "llama_cpp/cli/__init__.py"})


def string_imports(root: Path, package: str) -> list[str]:
    """``importlib.import_module(...)`` / ``__import__(...)`` calls outside the lazy ``__init__``s."""
    found = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in STRING_IMPORTS_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                found.append(f"{rel}:{node.lineno}")
    return found


def test_no_string_imports() -> None:
    found = string_imports(REPO, "llama_cpp")
    assert not found, "string imports hide edges from the graph: " + ", ".join(found)


def private_name_imports(root: Path, package: str) -> list[str]:
    """``from module import _name`` of a private name that is not a submodule: another module's
    internals (what a module needs from another is a public, documented name)."""
    modules = _modules(root, package)
    found = []
    for module, path in modules.items():
        rel = path.relative_to(root).as_posix()
        base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
            if not isinstance(node, ast.ImportFrom):
                continue
            parts = (base[:len(base) - node.level + 1] if node.level else []) + (node.module or "").split(".")
            source = ".".join(p for p in parts if p)
            if not source.startswith(package):
                continue
            for alias in node.names:
                name = alias.name
                if name.startswith("_") and not name.startswith("__") and f"{source}.{name}" not in modules:
                    found.append(f"{rel}:{node.lineno}: {name} from {source}")
    return found


def test_no_private_names_imported_across_modules() -> None:
    found = private_name_imports(REPO, "llama_cpp")
    assert not found, "private names imported from another module:\n" + "\n".join(found)


def test_private_name_checker(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "_sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import _sub\n")
    (pkg / "_sub" / "__init__.py").write_text("from .a import _hidden, shown\n")
    (pkg / "_sub" / "a.py").write_text("_hidden = 1\nshown = 2\n")
    assert private_name_imports(tmp_path, "pkg") == ["pkg/_sub/__init__.py:1: _hidden from pkg._sub.a"]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not name.endswith("_")  # _fields_: ctypes'


#: private attributes used through another object where that is right, per ``(file, attribute)``, with why
PRIVATE_ATTRIBUTES_ALLOWED: dict[tuple[str, str], str] = {
    ("llama_cpp/_native/loader.py", "_handle"): "ctypes.CDLL's OS handle: ctypes has no public accessor",
    ("llama_cpp/_native/loader.py", "_name"): "ctypes.CDLL's library name: ctypes has no public accessor",
    ("llama_cpp/_core/sampler.py", "_own"): "LlamaSampler.clone adopts the cloned pointer into its own new instance",
}


def _defined_here(tree: ast.AST) -> set[str]:
    """Names a module defines: functions, classes, module- and class-level assignments, ``self._x =``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) \
                and node.value.id in ("self", "cls"):
            names.add(node.attr)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    names.add(t.id)
    return names


def _external_names(tree: ast.AST, package: str) -> set[str]:
    """Names bound to other distributions' modules and objects (``sys``, ``ctypes``...)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith(package)}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not (node.module or "").startswith(package):
            names |= {a.asname or a.name for a in node.names}
    return names


def private_attribute_uses(root: Path, package: str) -> list[str]:
    """``obj._name`` (or ``getattr(obj, "_name")``) where ``obj`` is not ``self``/``cls`` and the module does
    not define ``_name`` itself: another module's internals reached through an object. A module may
    use the private attributes of the objects it defines (a class its own instances'); what another
    module needs is a public, documented attribute or function."""
    found = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), rel)
        own, external = _defined_here(tree), _external_names(tree, package)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                receiver, name = node.value, node.attr
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2 and \
                    isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                receiver, name = node.args[0], node.args[1].value
            else:
                continue
            if not _is_private(name) or name in own or (rel, name) in PRIVATE_ATTRIBUTES_ALLOWED:
                continue
            if isinstance(receiver, ast.Name) and (receiver.id in ("self", "cls") or receiver.id in external):
                continue
            if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super":
                continue
            found.append(f"{rel}:{node.lineno}: {ast.unparse(receiver)}.{name}")
    return found


def test_no_private_attributes_used_across_modules() -> None:
    found = private_attribute_uses(REPO, "llama_cpp")
    assert not found, "private attributes of another module's objects:\n" + "\n".join(found)


def test_private_attribute_checker(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("class A:\n    def __init__(self):\n        self._state = 1\n\n"
                              "    def merge(self, other):\n        return self._state + other._state\n")
    (pkg / "b.py").write_text("import sys\n\ndef f(a):\n    sys._getframe()\n    a.public\n    a._fields_\n"
                              "    return a._state, getattr(a, '_state', None)\n")
    assert private_attribute_uses(tmp_path, "pkg") == ["pkg/b.py:7: a._state", "pkg/b.py:7: a._state"]


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
    g, _ = graph(tmp_path, ("pkg",), type_checking=True)
    assert [e.target for e in g["pkg.c"]] == ["pkg.a"]  # counted when asked for
    (pkg / "d.py").write_text("import importlib\nm = importlib.import_module('pkg.a')\n")
    assert string_imports(tmp_path, "pkg") == ["pkg/d.py:2"]

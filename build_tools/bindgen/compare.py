"""Compare the committed bindings with the headers of a llama.cpp tree: the checklist ``bump`` prints."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HeaderError
from .generate import EXCLUDED
from .headers import REPO, Api, TypeRules, function_problems, struct_problems

PUBLIC_HEADERS = ("llama.h", "mtmd.h", "mtmd-helper.h", "llama-ext.h")
GGML_HEADERS = ("ggml.h", "ggml-alloc.h", "ggml-backend.h", "ggml-cpu.h", "ggml-opt.h", "gguf.h")
MODULES = ("ggml_cpp", "llama_cpp", "mtmd_cpp")


@dataclass
class Report:
    root: Path
    functions: list[str] = field(default_factory=list)
    structs: list[str] = field(default_factory=list)
    constants: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.functions or self.structs or self.constants)

    def render(self) -> str:
        out = [f"# bindings vs headers of {self.root}", ""]
        if self.clean:
            out.append("bindings are up to date: nothing to do")
            return "\n".join(out) + "\n"
        for title, items in (("Functions", self.functions), ("Struct fields", self.structs),
                             ("Constants (enums, #defines)", self.constants)):
            if items:
                out += [f"## {title} ({len(items)})", *(f"- [ ] {i}" for i in items), ""]
        out += ["## Then", "- [ ] update EXCLUDED/GGML_* in build_tools/bindgen/generate.py if needed",
                "- [ ] python -m build_tools.bindgen   (regenerates llama_cpp/{ggml,llama,mtmd}_cpp.py)",
                "- [ ] python -m pytest tests/native    (layout probe, coverage, symbols)"]
        return "\n".join(out) + "\n"


def _bindings() -> tuple[dict[str, object], dict[str, type], dict[str, object]]:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import ctypes

    functions: dict[str, object] = {}
    classes: dict[str, type] = {}
    constants: dict[str, object] = {}
    for name in MODULES:
        mod = importlib.import_module(f"llama_cpp.{name}")
        functions.update(mod.__bindings__.functions)
        for k, v in vars(mod).items():
            if isinstance(v, type) and issubclass(v, (ctypes.Structure, ctypes.Union)) and "_c_name_" in v.__dict__:
                classes[v._c_name_] = v
            elif k.isupper() and not k.startswith("_") and isinstance(v, (int, str)):
                constants[k] = v
    return functions, classes, constants


def compare(api: Api) -> Report:
    """Everything that differs between the headers at ``api.root`` and the committed bindings."""
    functions, classes, constants = _bindings()
    new_structs = {s.name for s in api.structs.values() if s.header in PUBLIC_HEADERS}
    rules = TypeRules(api, set(classes) | new_structs)
    rep = Report(api.root)

    for f in api.functions.values():
        if f.header in PUBLIC_HEADERS and f.name not in functions and f.name not in EXCLUDED:
            rep.functions.append(f"added: `{f.signature()}` ({f.header}:{f.line})")
    for name, fn in sorted(functions.items()):
        decl = api.functions.get(name)
        if decl is None:
            rep.functions.append(f"removed: {name} (bound in {fn.__module__}, no longer declared)")  # type: ignore[attr-defined]
            continue
        try:
            problems = function_problems(fn.argtypes, fn.restype, decl, rules)  # type: ignore[attr-defined]
        except HeaderError as exc:
            problems = [f"{name}: {exc}"]
        for p in problems:
            rep.functions.append(f"changed: {p} -- now `{decl.signature()}` ({decl.header}:{decl.line})")
        if (decl.deprecated or None) != (getattr(fn, "deprecated", None) or None):
            rep.functions.append(f"deprecation changed: {name}: header says {decl.deprecated!r}")

    for s in api.structs.values():
        if s.header in PUBLIC_HEADERS and s.name not in classes:
            rep.structs.append(f"added struct: {s.kind} {s.name} ({s.header}:{s.line})")
    for cname, cls in sorted(classes.items()):
        st = api.structs.get(cname)
        if st is None:
            rep.structs.append(f"removed struct: {cname}")
            continue
        try:
            rep.structs += struct_problems(cls, st, rules)
        except HeaderError as exc:
            rep.structs.append(f"{cname}: {exc}")

    declared: dict[str, int | str] = dict(api.enum_constants(*PUBLIC_HEADERS, *GGML_HEADERS))
    declared.update({d.name: d.value for d in api.defines.values()
                     if d.header in ("llama.h", "mtmd.h", "mtmd-helper.h", "ggml.h", "ggml-backend.h", "gguf.h")})
    for n, v in declared.items():
        if n not in constants:
            rep.constants.append(f"added: {n} = {v!r}")
        elif constants[n] != v:
            rep.constants.append(f"changed: {n} = {v!r} (bound as {constants[n]!r})")
    for n in sorted(set(constants) - set(declared)):
        rep.constants.append(f"removed: {n} (bound as {constants[n]!r})")
    return rep

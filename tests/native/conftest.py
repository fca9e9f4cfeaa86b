"""ABI fixtures: the parsed headers, the binding modules, and a compiled C layout probe.

The probe is C source generated from the *Python* side (every mirrored Structure/Union and every
bound constant), compiled with the system compiler against ``vendor/llama.cpp``'s headers; it
prints sizeof/alignof/offsetof and the constants' values, which the tests compare exactly.
"""

from __future__ import annotations

import ctypes
import subprocess
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from build_tools.bindgen import headers as H
from build_tools.common.compilers import CXX_COMPILERS, find_compiler
from build_tools.errors import ToolNotFoundError

REPO = Path(__file__).resolve().parents[2]
VENDOR = REPO / "vendor" / "llama.cpp"
INCLUDES = [VENDOR / d for d in ("include", "ggml/include", "tools/mtmd", "src")]

if not (VENDOR / "include" / "llama.h").exists():  # pragma: no cover - fresh clone without vendor
    pytest.skip("vendor/llama.cpp missing: run `python -m build_tools vendor`", allow_module_level=True)


def binding_modules() -> list[types.ModuleType]:
    from llama_cpp import ggml_cpp, llama_cpp, mtmd_cpp

    return [ggml_cpp, llama_cpp, mtmd_cpp]


def mirrored_classes(modules: list[types.ModuleType] | None = None) -> dict[str, type]:
    """C tag -> ctypes class, for every struct/union class a module defines with ``_c_name_``."""
    out: dict[str, type] = {}
    for mod in modules or binding_modules():
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, (ctypes.Structure, ctypes.Union)) \
                    and "_c_name_" in obj.__dict__ and obj.__module__ == mod.__name__:
                out[obj._c_name_] = obj
    return out


# --------------------------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------------------------


@dataclass
class Layout:
    size: int
    align: int
    fields: dict[str, tuple[int, int]] = field(default_factory=dict)  # C member -> (offset, size)


def py_layout(cls: type) -> Layout:
    """The layout ctypes computes; anonymous members are flattened like C's."""
    lay = Layout(ctypes.sizeof(cls), ctypes.alignment(cls))
    anonymous = set(getattr(cls, "_anonymous_", ()))
    for name, ftype, *_ in cls._fields_:
        desc = getattr(cls, name) if name not in anonymous else cls.__dict__[name]
        if name in anonymous:
            for sub, stype, *_ in ftype._fields_:
                sd = getattr(ftype, sub)
                lay.fields[sub] = (desc.offset + sd.offset, sd.size)
        else:
            lay.fields[name] = (desc.offset, desc.size)
    return lay


def compare_layout(c_name: str, py: Layout, c: Layout) -> list[str]:
    """Every difference between the ctypes and the compiler's layout, as readable lines."""
    out = []
    if py.size != c.size:
        out.append(f"{c_name}: sizeof {py.size} (ctypes) != {c.size} (C)")
    if py.align != c.align:
        out.append(f"{c_name}: alignof {py.align} (ctypes) != {c.align} (C)")
    for name in sorted(set(py.fields) | set(c.fields)):
        a, b = py.fields.get(name), c.fields.get(name)
        if a != b:
            out.append(f"{c_name}.{name}: (offset, size) {a} (ctypes) != {b} (C)")
    return out


def compare_field_types(cls: type, struct: H.Struct, rules: H.TypeRules) -> list[str]:
    """Field names, order and binding-rule types against the header declaration."""
    return H.struct_problems(cls, struct, rules)


# --------------------------------------------------------------------------------------------
# the probe
# --------------------------------------------------------------------------------------------


@dataclass
class ProbeResult:
    layouts: dict[str, Layout]
    ints: dict[str, int]
    strings: dict[str, str]


def _struct_kw(cls: type) -> str:
    return "union" if issubclass(cls, ctypes.Union) else "struct"


def probe_source(classes: dict[str, type], int_consts: list[str], str_consts: list[str],
                 headers: list[str]) -> str:
    lines = [*(f'#include "{h}"' for h in headers), "#include <stdio.h>", "#include <stddef.h>",
             "#include <stdalign.h>", "int main(void) {"]
    for cname, cls in sorted(classes.items()):
        t = f"{_struct_kw(cls)} {cname}"
        lines.append(f'  printf("S {cname} %zu %zu\\n", sizeof({t}), alignof({t}));')
        for member in py_layout(cls).fields:
            lines.append(f'  printf("F {cname} {member} %zu %zu\\n", offsetof({t}, {member}), '
                         f"sizeof((({t} *)0)->{member}));")
    for n in int_consts:
        lines.append(f'  printf("C {n} %lld\\n", (long long)({n}));')
    for n in str_consts:
        lines.append(f'  printf("T {n} %s\\n", {n});')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def parse_probe(text: str) -> ProbeResult:
    layouts: dict[str, Layout] = {}
    ints: dict[str, int] = {}
    strings: dict[str, str] = {}
    for line in text.splitlines():
        kind, rest = line.split(" ", 1)
        if kind == "S":
            n, size, align = rest.split()
            layouts[n] = Layout(int(size), int(align))
        elif kind == "F":
            n, member, off, size = rest.split()
            layouts[n].fields[member] = (int(off), int(size))
        elif kind == "C":
            n, v = rest.split()
            ints[n] = int(v)
        elif kind == "T":
            n, _, v = rest.partition(" ")
            strings[n] = v
    return ProbeResult(layouts, ints, strings)


def compile_and_run(src: str, tmp: Path, cxx: bool = False) -> str:
    try:
        compiler = str(find_compiler("CXX", CXX_COMPILERS) if cxx else find_compiler())
    except ToolNotFoundError:
        pytest.skip("no C++ compiler")
    ext = "cpp" if cxx else "c"
    (tmp / f"probe.{ext}").write_text(src)
    exe = tmp / ("probe_cxx" if cxx else "probe")
    std = "-std=c++17" if cxx else "-std=c11"
    cmd = [*compiler.split(), std, *(f"-I{d}" for d in INCLUDES), str(tmp / f"probe.{ext}"), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, f"probe did not compile ({' '.join(cmd)}):\n{r.stderr[-3000:]}"
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def bound_constants(api: H.Api) -> tuple[list[str], list[str]]:
    """Names of the enum constants and #defines the modules bind: (integers, strings)."""
    ints, strs = [], []
    for mod in binding_modules():
        for name, value in vars(mod).items():
            if not name.isupper() or name.startswith("_"):
                continue
            if name in api.defines and isinstance(api.defines[name].value, str):
                strs.append(name)
            elif isinstance(value, int) and (name in api.defines or name in api.enum_constants()):
                ints.append(name)
    return sorted(set(ints)), sorted(set(strs))


@pytest.fixture(scope="session")
def api() -> H.Api:
    return H.parse_api(VENDOR)


@pytest.fixture(scope="session")
def rules(api: H.Api) -> H.TypeRules:
    from build_tools.bindgen.generate import type_rules

    return type_rules(api)


@pytest.fixture(scope="session")
def probe(api: H.Api, tmp_path_factory: pytest.TempPathFactory) -> ProbeResult:
    classes = {n: c for n, c in mirrored_classes().items() if api.structs.get(n) and api.structs[n].header != "llama-ext.h"}
    ints, strs = bound_constants(api)
    src = probe_source(classes, ints, strs, ["llama.h", "mtmd.h", "mtmd-helper.h", "ggml-backend.h",
                                             "ggml-cpu.h", "ggml-opt.h", "gguf.h"])
    return parse_probe(compile_and_run(src, tmp_path_factory.mktemp("probe")))


@pytest.fixture(scope="session")
def probe_ext(api: H.Api, tmp_path_factory: pytest.TempPathFactory) -> ProbeResult:
    classes = {n: c for n, c in mirrored_classes().items() if api.structs.get(n) and api.structs[n].header == "llama-ext.h"}
    src = probe_source(classes, [], [], ["llama-ext.h"]).replace("#include <stdalign.h>", "")
    return parse_probe(compile_and_run(src, tmp_path_factory.mktemp("probe_ext"), cxx=True))

"""Parse the vendored llama.cpp C headers into plain data (functions, structs, enums, #defines).

Shared by the binding generator (:mod:`build_tools.bindgen.generate`), the ABI/coverage tests and the
bump tool. The headers are preprocessed by the system C compiler (``$CC``, ``cc`` or ``gcc``)
against a tiny fake libc written to a temporary directory, with ``-undef`` so no compiler
extensions (``__attribute__``) reach pycparser; deprecation markers and ``#define`` constants
are read from the raw header text.

Types are described by :class:`CType` trees; :func:`c_key` and :func:`ctypes_key` turn a C type
and a ctypes type into the same canonical string when (and only when) the ctypes type is the
binding rule's choice for that C type, which is what the coverage checks compare.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..common import proc
from ..common.compilers import find_compiler
from ..errors import HeaderError, MissingInputError

REPO = Path(__file__).resolve().parents[2]
VENDOR = REPO / "vendor" / "llama.cpp"

# header basename -> path relative to the llama.cpp tree
HEADER_PATHS: dict[str, str] = {
    "llama.h": "include/llama.h",
    "mtmd.h": "tools/mtmd/mtmd.h",
    "mtmd-helper.h": "tools/mtmd/mtmd-helper.h",
    "ggml.h": "ggml/include/ggml.h",
    "ggml-backend.h": "ggml/include/ggml-backend.h",
    "ggml-alloc.h": "ggml/include/ggml-alloc.h",
    "ggml-cpu.h": "ggml/include/ggml-cpu.h",
    "ggml-opt.h": "ggml/include/ggml-opt.h",
    "gguf.h": "ggml/include/gguf.h",
    "llama-ext.h": "src/llama-ext.h",
}
INCLUDE_DIRS = ("include", "ggml/include", "tools/mtmd")
ENTRY_HEADERS = ("llama.h", "mtmd.h", "mtmd-helper.h", "ggml-backend.h", "ggml-cpu.h", "ggml-opt.h", "gguf.h")
API_MACROS = {"llama.h": "LLAMA_API", "mtmd.h": "MTMD_API", "mtmd-helper.h": "MTMD_API", "llama-ext.h": "LLAMA_API"}

# x86-64 / aarch64 LP64 Linux: the platform the bindings and the probe are checked on.
_FAKE_LIBC = {
    "stdbool.h": "#define bool _Bool\n#define true 1\n#define false 0\n",
    "stddef.h": "typedef unsigned long size_t;\ntypedef long ptrdiff_t;\n#define NULL ((void*)0)\n",
    "stdint.h": (
        "typedef signed char int8_t; typedef unsigned char uint8_t;\n"
        "typedef short int16_t; typedef unsigned short uint16_t;\n"
        "typedef int int32_t; typedef unsigned int uint32_t;\n"
        "typedef long int64_t; typedef unsigned long uint64_t;\n"
        "typedef long intptr_t; typedef unsigned long uintptr_t;\n"
        "#define INT32_MAX 2147483647\n#define UINT32_MAX 4294967295u\n"
    ),
    "stdio.h": "typedef struct _IO_FILE FILE;\n",
    "stdarg.h": "typedef char * va_list;\n",
}
# Typedef names of the fake libc that the type rules know directly (kept by name in CType).
LIBC_TYPEDEFS = {
    "size_t": "u64", "ptrdiff_t": "i64", "int8_t": "i8", "uint8_t": "u8", "int16_t": "i16",
    "uint16_t": "u16", "int32_t": "i32", "uint32_t": "u32", "int64_t": "i64", "uint64_t": "u64",
    "intptr_t": "i64", "uintptr_t": "u64",
}
BUILTIN_KEYS = {
    "void": "void", "_Bool": "bool", "char": "char", "signed char": "i8", "unsigned char": "u8",
    "short": "i16", "short int": "i16", "unsigned short": "u16", "int": "i32", "signed": "i32",
    "signed int": "i32", "unsigned": "u32", "unsigned int": "u32", "long": "i64", "long int": "i64",
    "unsigned long": "u64", "long long": "i64", "unsigned long long": "u64", "float": "f32",
    "double": "f64",
}



# --------------------------------------------------------------------------------------------
# type model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CType:
    """A C type. ``kind``: name (builtin or typedef), struct, union, enum, ptr, array, func."""

    kind: str
    name: str = ""
    const: bool = False
    to: CType | None = None  # ptr/array element; func return type
    length: int | None = None  # array
    params: tuple[tuple[str, CType], ...] = ()  # func
    variadic: bool = False
    members: tuple[tuple[str, CType], ...] | None = None  # anonymous struct/union body

    def __str__(self) -> str:
        return self.declare("")

    def declare(self, decl: str) -> str:
        """C spelling of a declaration of ``decl`` with this type."""
        q = "const " if self.const else ""
        if self.kind == "name":
            return f"{q}{self.name} {decl}".rstrip()
        if self.kind in ("struct", "union", "enum"):
            return f"{q}{self.kind} {self.name or '<anonymous>'} {decl}".rstrip()
        if self.kind == "ptr":
            sep = "" if not decl or decl.startswith(("*", "(")) else " "
            inner = f"*{' const' if self.const else ''}{sep}{decl}"
            assert self.to is not None
            if self.to.kind in ("func", "array"):
                inner = f"({inner})"
            return self.to.declare(inner)
        if self.kind == "array":
            assert self.to is not None
            return self.to.declare(f"{decl}[{self.length if self.length is not None else ''}]")
        if self.kind == "func":
            assert self.to is not None
            ps = ", ".join(t.declare(n) for n, t in self.params) or "void"
            if self.variadic:
                ps += ", ..."
            return self.to.declare(f"{decl}({ps})")
        raise ValueError(self.kind)


VOID = CType("name", "void")


@dataclass(frozen=True)
class Function:
    name: str
    ret: CType
    params: tuple[tuple[str, CType], ...]
    variadic: bool
    header: str
    line: int
    deprecated: str | None = None
    comment: str = ""

    def signature(self) -> str:
        return CType("func", to=self.ret, params=self.params, variadic=self.variadic).declare(self.name)


@dataclass(frozen=True)
class Struct:
    name: str
    kind: str  # struct | union
    fields: tuple[tuple[str, CType], ...]
    header: str
    line: int
    comment: str = ""


@dataclass(frozen=True)
class Enum:
    name: str | None
    items: tuple[tuple[str, int], ...]
    header: str
    line: int


@dataclass(frozen=True)
class Define:
    name: str
    value: int | str
    header: str
    line: int


@dataclass(frozen=True)
class Typedef:
    name: str
    type: CType
    header: str
    line: int


@dataclass
class Api:
    """Everything the headers declare, by name; ``*_order`` keeps declaration order."""

    root: Path
    functions: dict[str, Function] = field(default_factory=dict)
    structs: dict[str, Struct] = field(default_factory=dict)
    enums: list[Enum] = field(default_factory=list)
    defines: dict[str, Define] = field(default_factory=dict)
    typedefs: dict[str, Typedef] = field(default_factory=dict)
    opaque: set[str] = field(default_factory=set)  # structs declared but never defined
    opaque_headers: dict[str, str] = field(default_factory=dict)

    def functions_in(self, *headers: str) -> list[Function]:
        return [f for f in self.functions.values() if f.header in headers]

    def enum_constants(self, *headers: str) -> dict[str, int]:
        return {n: v for e in self.enums if not headers or e.header in headers for n, v in e.items}

    def resolve(self, t: CType) -> CType:
        """Follow typedefs (keeping the libc ones by name); const of the typedef use is kept."""
        seen = 0
        while t.kind == "name" and t.name in self.typedefs and t.name not in LIBC_TYPEDEFS:
            target = self.typedefs[t.name].type
            t = CType(**{**target.__dict__, "const": target.const or t.const})
            seen += 1
            if seen > 50:
                raise HeaderError(f"typedef loop at {t}")
        return t


# --------------------------------------------------------------------------------------------
# preprocessing and parsing
# --------------------------------------------------------------------------------------------


def write_fake_libc(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in _FAKE_LIBC.items():
        (directory / name).write_text(text)
    return directory


def header_path(root: Path, header: str) -> Path:
    return Path(root) / HEADER_PATHS[header]


def _strip_cpp_ext(text: str) -> str:
    """The C-compatible declarations of the C++ staging header ``src/llama-ext.h``."""
    text = re.sub(r"//[^\n]*", "", text)
    decls = []
    for m in re.finditer(r"LLAMA_API\s[^;{]*;", text):
        d = m.group(0)
        if "std::" in d or "llama_memory_breakdown " in d:
            continue  # returns a C++ type: not callable from C
        decls.append(d)
    # Struct definitions without C++ members (initializers/methods): kept verbatim.
    structs = []
    cxx_only: set[str] = set()
    for m in re.finditer(r"struct\s+(\w+)\s*\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\};", text):
        body = m.group(2)
        if "=" in body or "(" in body or any(re.search(rf"\b{n}\b", body) for n in cxx_only):
            cxx_only.add(m.group(1))
            continue
        structs.append(m.group(0))
    # C++ lets a tag name stand alone; C needs typedefs.
    tags = {"llama_model": "struct", "llama_context": "struct", "quantize_state_impl": "struct",
            "ggml_tensor": "struct", "llama_quant_model_desc": "struct", "ggml_type": "enum",
            "llama_ftype": "enum"}
    head = "".join(f"typedef {k} {n} {n};\n" for n, k in tags.items() if n != "llama_model_quantize_params")
    return head + "\n".join(structs) + "\n" + "\n".join(decls) + "\n"


def preprocess(root: Path, headers: Sequence[str] = ENTRY_HEADERS, *, ext: bool = True) -> str:
    """Run the C preprocessor over ``headers`` of the llama.cpp tree at ``root``."""
    root = Path(root)
    cc = str(find_compiler(hint="it preprocesses the headers"))
    with tempfile.TemporaryDirectory(prefix="llama-headers-") as tmp:
        t = Path(tmp)
        fake = write_fake_libc(t / "fake_libc")
        src = t / "all.c"
        lines = [f'#include "{h}"' for h in headers]
        if ext and header_path(root, "llama-ext.h").exists():
            ext_c = t / "llama-ext.h"
            ext_c.write_text(_strip_cpp_ext(header_path(root, "llama-ext.h").read_text()))
            lines.append(f'#include "{ext_c}"')
        src.write_text("\n".join(lines) + "\n")
        cmd = [cc, "-E", "-undef", "-nostdinc", "-std=c11", "-D__STDC_VERSION__=201112L",
               "-isystem", str(fake), *(f"-I{root / d}" for d in INCLUDE_DIRS), str(src)]
        out = proc.run(cmd, what=f"preprocessing ({' '.join(cmd)})", error=HeaderError).stdout
        # Report the staging header under its real name.
        return out.replace(str(t / "llama-ext.h"), str(header_path(root, "llama-ext.h")))


def _eval_const(node, known: dict[str, int]) -> int:
    from pycparser import c_ast

    if isinstance(node, c_ast.Constant):
        v = node.value.rstrip("uUlL")
        if node.type == "char":
            return ord(v.strip("'"))
        return int(v, 0) if not (v.startswith("0") and len(v) > 1 and v[1].isdigit()) else int(v, 8)
    if isinstance(node, c_ast.ID):
        if node.name not in known:
            raise HeaderError(f"unknown constant {node.name}")
        return known[node.name]
    if isinstance(node, c_ast.UnaryOp):
        v = _eval_const(node.expr, known)
        return {"-": -v, "+": v, "~": ~v, "!": int(not v)}[node.op]
    if isinstance(node, c_ast.BinaryOp):
        a, b = _eval_const(node.left, known), _eval_const(node.right, known)
        ops = {"+": a + b, "-": a - b, "*": a * b, "<<": a << b if b >= 0 else 0, ">>": a >> b if b >= 0 else 0,
               "|": a | b, "&": a & b, "^": a ^ b}
        if node.op == "/":
            return int(a / b)
        return ops[node.op]
    if isinstance(node, c_ast.Cast):
        return _eval_const(node.expr, known)
    raise HeaderError(f"cannot evaluate constant expression {type(node).__name__}")


class _Converter:
    def __init__(self, api: Api, raw_lines: dict[str, list[str]]) -> None:
        self.api = api
        self.raw = raw_lines
        self.enum_values: dict[str, int] = {}
        self.declared: set[str] = set()

    @staticmethod
    def header_of(coord) -> str:
        return os.path.basename(str(coord.file)) if coord is not None else "?"

    def type_of(self, node) -> CType:
        from pycparser import c_ast

        if isinstance(node, (c_ast.Struct, c_ast.Union, c_ast.Enum)):
            node = c_ast.TypeDecl(None, [], None, node)
        if isinstance(node, c_ast.TypeDecl):
            const = "const" in node.quals
            inner = node.type
            if isinstance(inner, c_ast.IdentifierType):
                return CType("name", " ".join(inner.names), const=const)
            if isinstance(inner, (c_ast.Struct, c_ast.Union)):
                kind = "struct" if isinstance(inner, c_ast.Struct) else "union"
                self.record_struct(inner, kind)
                members = None
                if inner.name is None and inner.decls is not None:
                    members = tuple((d.name or "", self.type_of(d.type)) for d in inner.decls)
                return CType(kind, inner.name or "", const=const, members=members)
            if isinstance(inner, c_ast.Enum):
                self.record_enum(inner)
                return CType("enum", inner.name or "", const=const)
            raise HeaderError(f"unsupported type node {type(inner).__name__}")
        if isinstance(node, c_ast.PtrDecl):
            return CType("ptr", const="const" in node.quals, to=self.type_of(node.type))
        if isinstance(node, c_ast.ArrayDecl):
            try:
                n = _eval_const(node.dim, self.enum_values) if node.dim is not None else None
            except HeaderError:
                n = -1  # e.g. a sizeof() expression: only matters if the struct were mirrored
            return CType("array", to=self.type_of(node.type), length=n)
        if isinstance(node, c_ast.FuncDecl):
            params, variadic = self.params_of(node)
            return CType("func", to=self.type_of(node.type), params=params, variadic=variadic)
        raise HeaderError(f"unsupported declarator {type(node).__name__}")

    def params_of(self, fdecl) -> tuple[tuple[tuple[str, CType], ...], bool]:
        from pycparser import c_ast

        out: list[tuple[str, CType]] = []
        variadic = False
        for i, p in enumerate(fdecl.args.params if fdecl.args else []):
            if isinstance(p, c_ast.EllipsisParam):
                variadic = True
                continue
            t = self.type_of(p.type)
            if t.kind == "name" and t.name == "void" and not out and getattr(p, "name", None) is None:
                continue
            out.append((p.name or f"arg{i}", t))
        return tuple(out), variadic

    def record_struct(self, node, kind: str) -> None:
        if node.name is None:
            return
        if node.decls is None:
            self.declared.add(node.name)
            self.api.opaque_headers.setdefault(node.name, self.header_of(node.coord))
            return
        if node.name in self.api.structs:
            return
        fields = []
        for d in node.decls:
            t = self.type_of(d.type)
            fields.append((d.name or "", t))
        h = self.header_of(node.coord)
        line = node.coord.line if node.coord else 0
        self.api.structs[node.name] = Struct(node.name, kind, tuple(fields), h, line, self.comment_before(h, line))

    def record_enum(self, node) -> None:
        if node.values is None:
            return
        h = self.header_of(node.coord)
        if any(e.name == node.name and e.header == h and node.name for e in self.api.enums):
            return
        items = []
        nxt = 0
        for e in node.values.enumerators:
            v = _eval_const(e.value, self.enum_values) if e.value is not None else nxt
            self.enum_values[e.name] = v
            items.append((e.name, v))
            nxt = v + 1
        self.api.enums.append(Enum(node.name, tuple(items), h, node.coord.line if node.coord else 0))

    def comment_before(self, header: str, line: int) -> str:
        """The ``//`` comment block right above ``line`` of ``header`` (1-based), as text."""
        lines = self.raw.get(header)
        if not lines or line <= 1:
            return ""
        out: list[str] = []
        i = line - 2
        while i >= 0:
            s = lines[i].strip()
            if s.startswith("//"):
                out.append(s.lstrip("/").strip())
                i -= 1
                continue
            break
        return "\n".join(reversed(out)).strip()

    def visit(self, ast) -> None:
        from pycparser import c_ast

        for ext in ast.ext:
            if isinstance(ext, c_ast.Typedef):
                t = self.type_of(ext.type)
                h = self.header_of(ext.coord)
                if ext.name not in self.api.typedefs or self.api.typedefs[ext.name].header == "?":
                    self.api.typedefs.setdefault(ext.name, Typedef(ext.name, t, h, ext.coord.line))
            elif isinstance(ext, c_ast.Decl):
                if isinstance(ext.type, c_ast.FuncDecl):
                    self.record_function(ext)
                elif isinstance(ext.type, c_ast.Struct):
                    self.record_struct(ext.type, "struct")
                elif isinstance(ext.type, c_ast.Union):
                    self.record_struct(ext.type, "union")
                elif isinstance(ext.type, c_ast.Enum):
                    self.record_enum(ext.type)
                else:
                    self.type_of(ext.type)

    def record_function(self, decl) -> None:
        h = self.header_of(decl.coord)
        if h not in HEADER_PATHS:
            return
        params, variadic = self.params_of(decl.type)
        ret = self.type_of(decl.type.type)
        line = decl.coord.line
        if h == "llama-ext.h":  # parsed from a stripped copy: find the real line
            for i, text in enumerate(self.raw.get(h, []), 1):
                if re.search(rf"\b{decl.name}\s*\(", text):
                    line = i
                    break
        fn = Function(decl.name, ret, params, variadic, h, line,
                      deprecated_hints(self.raw.get(h, [])).get(decl.name), self.comment_before(h, line))
        self.api.functions.setdefault(decl.name, fn)


@functools.cache
def _deprecated_cached(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in re.finditer(r"DEPRECATED\(", text):
        # find the function name: identifier before the first "(" after DEPRECATED(
        rest = text[m.end():]
        fm = re.search(r"(\w+)\s*\(", rest)
        if not fm:
            continue
        # the hint: the string literal after the matching parenthesis of the declaration
        depth, i = 1, 0
        while i < len(rest) and depth:
            depth += {"(": 1, ")": -1}.get(rest[i], 0)
            i += 1
        body = rest[:i]
        hm = re.search(r'"([^"]*)"\s*\)\s*$', body)
        out[fm.group(1)] = hm.group(1) if hm else "deprecated"
    return out


def deprecated_hints(lines: list[str]) -> dict[str, str]:
    """Function name -> the hint of its ``DEPRECATED(decl, "hint")`` marker."""
    return _deprecated_cached("\n".join(lines))


_DEFINE_RE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)\s+(.*?)\s*(?://.*)?$")
_SKIP_DEFINES = re.compile(r"^(LLAMA_API|MTMD_API|GGML_API|GGML_BACKEND_API|GGML_RESTRICT|GGML_NORETURN|"
                           r"_WIN32_WINNT|GGML_DEPRECATED|GGML_ATTRIBUTE_FORMAT|GGML_UNUSED.*|.*_H)$")


def parse_defines(header: str, text: str) -> list[Define]:
    """Object-like ``#define NAME value`` constants with a literal (or aliased) value."""
    out: list[Define] = []
    known: dict[str, int | str] = {}
    matches = [(i, _DEFINE_RE.match(line)) for i, line in enumerate(text.splitlines(), 1)]
    counts: dict[str, int] = {}
    for _, m in matches:
        if m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    for i, m in matches:
        if not m or _SKIP_DEFINES.match(m.group(1)) or counts[m.group(1)] > 1:
            continue  # several definitions: platform-dependent, not a constant of the API
        name, value = m.group(1), m.group(2).strip()
        v: int | str
        if re.fullmatch(r"-?(0[xX][0-9a-fA-F]+|\d+)[uUlL]*", value):
            v = int(value.rstrip("uUlL"), 0)
        elif re.fullmatch(r'"[^"\\]*"', value):
            v = value[1:-1]
        elif value in known:
            v = known[value]
        else:
            continue
        known[name] = v
        out.append(Define(name, v, header, i))
    return out


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for name in sorted(HEADER_PATHS):
        p = header_path(root, name)
        h.update(name.encode())
        h.update(p.read_bytes() if p.exists() else b"<missing>")
    return h.hexdigest()


_CACHE: dict[tuple[str, str], Api] = {}


def parse_api(root: Path | None = None) -> Api:
    """Parse the llama.cpp tree at ``root`` (default: ``vendor/llama.cpp``); cached per content."""
    root = Path(root or VENDOR).resolve()
    if not header_path(root, "llama.h").exists():
        raise MissingInputError(f"{header_path(root, 'llama.h')} not found: run `python -m build_tools vendor` "
                          "or pass the root of a llama.cpp tree")
    key = (str(root), _tree_digest(root))
    if key in _CACHE:
        return _CACHE[key]
    try:
        import pycparser
    except ImportError as exc:  # pragma: no cover - pycparser is a test/bump requirement
        raise HeaderError("pycparser is needed to parse the headers: pip install -r requirements/test.txt") from exc
    text = preprocess(root)
    raw = {name: header_path(root, name).read_text(errors="replace").splitlines()
           for name in HEADER_PATHS if header_path(root, name).exists()}
    try:
        ast = pycparser.CParser().parse(text, "headers.i")
    except Exception as exc:  # pycparser's ParseError moved between versions
        raise HeaderError(f"pycparser could not parse the preprocessed headers: {exc}") from exc
    api = Api(root)
    conv = _Converter(api, raw)
    conv.visit(ast)
    api.opaque = conv.declared - set(api.structs)
    for name, lines in raw.items():
        for d in parse_defines(name, "\n".join(lines)):
            api.defines.setdefault(d.name, d)
    _CACHE[key] = api
    return api


# --------------------------------------------------------------------------------------------
# the binding rules, as canonical keys
# --------------------------------------------------------------------------------------------


class TypeRules:
    """Which ctypes type a C type is bound as, expressed as a canonical key string.

    ``mirrored``: names of structs/unions bound as ctypes classes (pointers to any other struct
    are ``void*``). Contexts: ``arg``/``ret``/``field`` for functions and struct fields, ``cbarg``/
    ``cbret`` inside a callback type (ctypes callbacks cannot return ``char*`` safely: ``void*``).
    """

    def __init__(self, api: Api, mirrored: Iterable[str]) -> None:
        self.api = api
        self.mirrored = set(mirrored)

    def key(self, t: CType, ctx: str = "arg") -> str:
        api = self.api
        if t.kind == "name" and t.name in LIBC_TYPEDEFS:
            return LIBC_TYPEDEFS[t.name]
        t = api.resolve(t)
        if t.kind == "name" and t.name in LIBC_TYPEDEFS:
            return LIBC_TYPEDEFS[t.name]
        if t.kind == "name":
            if t.name == "FILE":
                return "opaque:FILE"
            if t.name not in BUILTIN_KEYS:
                raise HeaderError(f"unknown type name {t.name}")
            return BUILTIN_KEYS[t.name]
        if t.kind == "enum":
            return "i32"
        if t.kind in ("struct", "union"):
            if t.members is not None:
                body = ",".join(f"{n}:{self.key(mt, 'field')}" for n, mt in t.members)
                return f"{t.kind}{{{body}}}"
            if t.name in self.mirrored:
                return f"{t.kind}:{t.name}"
            return f"opaque:{t.name}"
        if t.kind == "array":
            assert t.to is not None
            return f"{self.key(t.to, 'field')}[{t.length}]"
        if t.kind == "func":
            return self.func_key(t)
        if t.kind == "ptr":
            assert t.to is not None
            to = api.resolve(t.to)
            if to.kind == "func":
                return self.func_key(to)
            if ctx == "cbret":
                return "void*"
            if to.kind == "name" and to.name == "char" and t.to.kind == "name" and t.to.name not in LIBC_TYPEDEFS:
                return "char*"
            if to.kind == "name" and to.name == "void":
                return "void*"
            if to.kind in ("struct", "union") and to.name not in self.mirrored and to.members is None:
                return "void*"
            if to.kind == "name" and to.name == "FILE":
                return "void*"
            return f"ptr({self.key(t.to, 'field')})"
        raise HeaderError(f"unsupported type {t}")

    def func_key(self, f: CType) -> str:
        assert f.to is not None
        ret = self.api.resolve(f.to)
        if ret.kind in ("struct", "union"):
            return "void*"  # callbacks returning a struct by value: ctypes cannot build them
        if f.variadic:
            return "void*"
        args = ",".join(self.key(t, "cbarg") for _, t in f.params)
        return f"fn({self.key(f.to, 'cbret')};{args})"


def ctypes_key(t: object) -> str:
    """The canonical key of a ctypes type (or ``None`` for void), comparable with :meth:`TypeRules.key`."""
    if t is None:
        return "void"
    if not isinstance(t, type):
        raise TypeError(f"not a ctypes type: {t!r}")
    if t is ctypes.c_char_p:
        return "char*"
    if t is ctypes.c_void_p:
        return "void*"
    if t is ctypes.c_bool:
        return "bool"
    if t is ctypes.c_char:
        return "char"
    if t in (ctypes.c_float,):
        return "f32"
    if t in (ctypes.c_double,):
        return "f64"
    opaque = getattr(t, "_c_opaque_", None)
    if opaque:
        return f"opaque:{opaque}"
    if issubclass(t, ctypes._SimpleCData) and t._type_ in "bBhHiIlLqQ":
        signed = t._type_ in "bhilq"
        return f"{'i' if signed else 'u'}{ctypes.sizeof(t) * 8}"
    if issubclass(t, ctypes._Pointer):
        return f"ptr({ctypes_key(t._type_)})"
    if issubclass(t, ctypes.Array):
        return f"{ctypes_key(t._type_)}[{t._length_}]"
    if issubclass(t, (ctypes.Structure, ctypes.Union)):
        kind = "struct" if issubclass(t, ctypes.Structure) else "union"
        cname = t.__dict__.get("_c_name_")
        if cname:
            return f"{kind}:{cname}"
        body = ",".join(f"{f[0]}:{ctypes_key(f[1])}" for f in t._fields_)
        return f"{kind}{{{body}}}"
    if issubclass(t, ctypes._CFuncPtr):
        args = ",".join(ctypes_key(a) for a in t._argtypes_)
        return f"fn({ctypes_key(t._restype_)};{args})"
    raise TypeError(f"no key for ctypes type {t!r}")


# --------------------------------------------------------------------------------------------
# comparing bindings with declarations (tests/native and the bump tool)
# --------------------------------------------------------------------------------------------


def function_problems(argtypes: Sequence[object], restype: object, decl: Function, rules: TypeRules) -> list[str]:
    """Argument count and types of a binding against its declaration, as readable lines."""
    if len(argtypes) != len(decl.params):
        return [f"{decl.name}: {len(argtypes)} argtypes, header has {len(decl.params)}: {decl.signature()}"]
    out = []
    for i, (t, (pname, ct)) in enumerate(zip(argtypes, decl.params)):
        want, got = rules.key(ct, "arg"), ctypes_key(t)
        if want != got:
            out.append(f"{decl.name} arg {i} ({pname}): ctypes {got} != header {ct} ({want})")
    want, got = rules.key(decl.ret, "ret"), ctypes_key(restype)
    if want != got:
        out.append(f"{decl.name} return: ctypes {got} != header {decl.ret} ({want})")
    return out


def struct_problems(cls: type, struct: Struct, rules: TypeRules) -> list[str]:
    """Field names, order and types of a ctypes class against the header's struct."""
    anonymous = set(getattr(cls, "_anonymous_", ()))
    py_fields = [(n if n not in anonymous else "", t) for n, t, *_ in cls._fields_]  # type: ignore[attr-defined]
    py_names, c_names = [n for n, _ in py_fields], [n for n, _ in struct.fields]
    out = []
    if py_names != c_names:
        for n in c_names:
            if n not in py_names:
                t = dict(struct.fields)[n]
                out.append(f"{struct.name}: field added in the header: {t.declare(n)}")
        for n in py_names:
            if n not in c_names:
                out.append(f"{struct.name}: field removed from the header: {n or '<anonymous>'}")
        common_py = [n for n in py_names if n in c_names]
        common_c = [n for n in c_names if n in py_names]
        if common_py != common_c:
            out.append(f"{struct.name}: fields reordered: header order {c_names}")
    ctypes_of = dict(py_fields)
    for n, ct in struct.fields:
        if n in ctypes_of:
            want, got = rules.key(ct, "field"), ctypes_key(ctypes_of[n])
            if want != got:
                out.append(f"{struct.name}.{n or '<anonymous>'}: ctypes {got} != header {ct} ({want})")
    return out

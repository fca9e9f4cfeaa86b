"""Generate the low-level ctypes modules from the vendored headers.

    python -m build_tools.bindgen            # rewrite llama_cpp/{ggml_cpp,llama_cpp,mtmd_cpp}.py
    python -m build_tools.bindgen --check    # exit 1 when the committed modules are stale

The output is deterministic and committed. The binding rules are the ones
:class:`build_tools.bindgen.headers.TypeRules` describes: enums are ``c_int`` plus module constants,
pointers to opaque structs are ``c_void_p`` (``<name>_p`` aliases), ``char *`` is ``c_char_p``,
mirrored structs are ``ctypes.Structure`` classes with the C field names (an anonymous union is
a field named ``value`` listed in ``_anonymous_``), callbacks are ``CFUNCTYPE`` types.
"""

from __future__ import annotations

import argparse
import keyword
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .headers import LIBC_TYPEDEFS, REPO, Api, CType, Function, TypeRules, parse_api

PKG = REPO / "llama_cpp"

# Functions of ggml.h bound beyond the whole of ggml-backend.h: what the runtime uses.
GGML_H_FUNCTIONS = (
    "ggml_log_get", "ggml_log_set", "ggml_version", "ggml_commit", "ggml_time_init", "ggml_time_ms",
    "ggml_time_us", "ggml_type_name", "ggml_type_size", "ggml_blck_size", "ggml_row_size", "ggml_type_sizef",
    "ggml_is_quantized", "ggml_ftype_to_ggml_type", "ggml_op_name", "ggml_status_to_string",
    "ggml_threadpool_params_default", "ggml_threadpool_params_init", "ggml_threadpool_params_match",
    "ggml_nbytes", "ggml_nelements", "ggml_get_name", "ggml_n_dims", "ggml_set_abort_callback",
)
GGML_STRUCTS = (
    "ggml_init_params", "ggml_threadpool_params", "ggml_backend_dev_caps", "ggml_backend_dev_props",
    "ggml_backend_feature", "ggml_backend_meta_split_state", "ggml_backend_graph_copy",
    "ggml_opt_optimizer_params",
)

# Declared functions deliberately not bound, with the reason (checked by tests/native).
EXCLUDED: dict[str, str] = {
    "mtmd_get_memory_usage": "C++ only (declared under __cplusplus, returns std::map)",
    "llama_get_memory_breakdown": "C++ only (returns std::map)",
}
GGML_CPU_REASON = ("lives in the CPU backend module, loaded at run time (GGML_BACKEND_DL): reach it through "
                   "ggml_backend_reg_get_proc_address")


#: upstream's module attribute naming each module's loaded library (``llama_cpp.llama_cpp._lib``, which
#: llguidance reads; ``mtmd_cpp._libmtmd``; ``_ggml.libggml`` upstream), served by the module's ``__getattr__``
LIBRARY_ALIASES = {"ggml_cpp": ("libggml",), "llama_cpp": ("_lib",), "mtmd_cpp": ("_libmtmd",)}


@dataclass
class ModuleSpec:
    name: str  # module file stem
    title: str
    library: str  # loader handle name
    headers: tuple[str, ...]
    imports: tuple[str, ...] = ()  # earlier generated modules whose names may be used
    functions: tuple[str, ...] | None = None  # None: every function of the headers
    structs: tuple[str, ...] | None = None
    define_headers: tuple[str, ...] | None = None
    optional_headers: tuple[str, ...] = ()  # C++ staging headers: optional, mangled symbols


def module_specs(api: Api) -> list[ModuleSpec]:
    ggml_headers = ("ggml.h", "ggml-alloc.h", "ggml-backend.h", "ggml-cpu.h", "ggml-opt.h", "gguf.h")
    ggml_fns = tuple(f.name for f in api.functions_in("ggml-backend.h")) + GGML_H_FUNCTIONS
    return [
        ModuleSpec("ggml_cpp", "ggml (backend registry and devices, logging, types)", "ggml", ggml_headers,
                   functions=ggml_fns, structs=GGML_STRUCTS, define_headers=("ggml.h", "ggml-backend.h", "gguf.h")),
        ModuleSpec("llama_cpp", "llama.h", "llama", ("llama.h",), imports=("ggml_cpp",),
                   optional_headers=("llama-ext.h",)),
        ModuleSpec("mtmd_cpp", "mtmd.h and mtmd-helper.h", "mtmd", ("mtmd.h", "mtmd-helper.h"),
                   imports=("ggml_cpp", "llama_cpp")),
    ]


def mirrored_structs(api: Api) -> set[str]:
    out = set(GGML_STRUCTS)
    out |= {s.name for s in api.structs.values() if s.header in ("llama.h", "mtmd.h", "mtmd-helper.h", "llama-ext.h")}
    return out


def type_rules(api: Api) -> TypeRules:
    return TypeRules(api, mirrored_structs(api))


# --------------------------------------------------------------------------------------------
# C++ name mangling for the optional staging symbols
# --------------------------------------------------------------------------------------------

_ITANIUM_BUILTIN = {
    "void": "v", "_Bool": "b", "char": "c", "signed char": "a", "unsigned char": "h", "short": "s",
    "unsigned short": "t", "int": "i", "unsigned int": "j", "unsigned": "j", "long": "l", "unsigned long": "m",
    "long long": "x", "unsigned long long": "y", "float": "f", "double": "d",
}
_LIBC_ITANIUM = {"i8": "a", "u8": "h", "i16": "s", "u16": "t", "i32": "i", "u32": "j", "i64": "l", "u64": "m"}
_MSVC_BUILTIN = {
    "void": "X", "_Bool": "_N", "char": "D", "signed char": "C", "unsigned char": "E", "short": "F",
    "unsigned short": "G", "int": "H", "unsigned int": "I", "unsigned": "I", "long": "J", "unsigned long": "K",
    "long long": "_J", "unsigned long long": "_K", "float": "M", "double": "N",
}
# Windows x64: LLP64, so 64-bit typedefs are (unsigned) __int64.
_LIBC_MSVC = {"i8": "C", "u8": "E", "i16": "F", "u16": "G", "i32": "H", "u32": "I", "i64": "_J", "u64": "_K"}


def _cxx_resolve(api: Api, t: CType) -> CType:
    """Resolve typedefs to what C++ mangles: the tag type (``typedef struct X X``) or the pointer
    (``ggml_backend_dev_t``); the fixed-width libc names are kept and mapped to builtins."""
    while t.kind == "name" and t.name in api.typedefs and t.name not in LIBC_TYPEDEFS:
        target = api.typedefs[t.name].type
        t = CType(**{**target.__dict__, "const": target.const or t.const})
    return t


def itanium_name(api: Api, fn: Function) -> str:
    """The Itanium C++ ABI symbol of a free function (Linux, macOS, MinGW)."""
    table: list[tuple] = []

    def canon(t: CType) -> tuple:
        t = _cxx_resolve(api, t)
        if t.kind == "ptr":
            assert t.to is not None
            return ("P", canon(t.to))
        inner = ("N", t.kind, t.name)
        return ("K", inner) if t.const else inner

    def enc(t: CType, top: bool = False) -> str:
        t = _cxx_resolve(api, t)
        if top and t.const:
            t = CType(**{**t.__dict__, "const": False})  # top-level cv is not part of the signature
        if t.kind == "name":
            code = _LIBC_ITANIUM.get(LIBC_TYPEDEFS.get(t.name, ""), None) or _ITANIUM_BUILTIN.get(t.name)
            if code is None:
                raise ValueError(f"cannot mangle {t}")
            if not t.const:
                return code
        k = canon(t)
        if k in table:
            i = table.index(k)
            return "S_" if i == 0 else f"S{_base36(i - 1)}_"
        if t.kind == "ptr":
            assert t.to is not None
            s = "P" + enc(t.to)
        elif t.const:
            s = "K" + enc(CType(**{**t.__dict__, "const": False}))
        elif t.kind in ("struct", "union", "enum"):
            s = f"{len(t.name)}{t.name}"
        else:
            raise ValueError(f"cannot mangle {t}")
        table.append(k)
        return s

    params = "".join(enc(t, top=True) for _, t in fn.params) or "v"
    return f"_Z{len(fn.name)}{fn.name}{params}"


def _base36(n: int) -> str:
    digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out = ""
    while True:
        out = digits[n % 36] + out
        n //= 36
        if not n:
            return out


def msvc_name(api: Api, fn: Function) -> str:
    """The MSVC x64 decorated name (untested here: no Windows build on this machine)."""
    names: list[str] = [fn.name]
    types: list[str] = []

    def name_frag(n: str) -> str:
        if n in names:
            return str(names.index(n))
        if len(names) < 10:
            names.append(n)
        return n + "@"

    def enc(t: CType) -> str:
        t = _cxx_resolve(api, t)
        if t.kind == "name":
            code = _LIBC_MSVC.get(LIBC_TYPEDEFS.get(t.name, ""), None) or _MSVC_BUILTIN.get(t.name)
            if code is None:
                raise ValueError(f"cannot decorate {t}")
            return code
        if t.kind == "ptr":
            assert t.to is not None
            to = _cxx_resolve(api, t.to)
            return "PE" + ("B" if to.const else "A") + enc(CType(**{**to.__dict__, "const": False}))
        if t.kind in ("struct", "union"):
            return ("U" if t.kind == "struct" else "T") + name_frag(t.name) + "@"
        if t.kind == "enum":
            return "W4" + name_frag(t.name) + "@"
        raise ValueError(f"cannot decorate {t}")

    ret_t = _cxx_resolve(api, fn.ret)
    ret = ("?A" if ret_t.kind in ("struct", "union", "enum") else "") + enc(fn.ret)
    args = ""
    for _, t in fn.params:
        e = enc(t)
        if len(e) > 1 and e in types:
            args += str(types.index(e))
        else:
            if len(e) > 1 and len(types) < 10:
                types.append(e)
            args += e
    tail = (args + "@Z") if fn.params else "XZ"
    return f"?{fn.name}@@YA{ret}{tail}"


# --------------------------------------------------------------------------------------------
# code generation
# --------------------------------------------------------------------------------------------

_CTYPES_BUILTIN = {
    "_Bool": "ctypes.c_bool", "char": "ctypes.c_char", "signed char": "ctypes.c_byte",
    "unsigned char": "ctypes.c_ubyte", "short": "ctypes.c_short", "short int": "ctypes.c_short",
    "unsigned short": "ctypes.c_ushort", "int": "ctypes.c_int", "signed": "ctypes.c_int", "signed int": "ctypes.c_int",
    "unsigned": "ctypes.c_uint", "unsigned int": "ctypes.c_uint", "long": "ctypes.c_long", "long int": "ctypes.c_long",
    "unsigned long": "ctypes.c_ulong", "long long": "ctypes.c_longlong", "unsigned long long": "ctypes.c_ulonglong",
    "float": "ctypes.c_float", "double": "ctypes.c_double",
}
_CTYPES_LIBC = {
    "size_t": "ctypes.c_size_t", "ptrdiff_t": "ctypes.c_ssize_t", "int8_t": "ctypes.c_int8",
    "uint8_t": "ctypes.c_uint8", "int16_t": "ctypes.c_int16", "uint16_t": "ctypes.c_uint16",
    "int32_t": "ctypes.c_int32", "uint32_t": "ctypes.c_uint32", "int64_t": "ctypes.c_int64",
    "uint64_t": "ctypes.c_uint64", "intptr_t": "ctypes.c_ssize_t", "uintptr_t": "ctypes.c_size_t",
}


def class_name(api: Api, struct: str) -> str:
    """Python class name of a mirrored struct: the C tag, unless a function has that name."""
    return f"{struct}_struct" if struct in api.functions else struct


@dataclass
class Emitter:
    api: Api
    spec: ModuleSpec
    rules: TypeRules
    names: dict[str, str]  # python names available -> defining module ("" = this one)
    used_imports: dict[str, set[str]] = field(default_factory=dict)
    anon: list[str] = field(default_factory=list)  # generated anonymous types' definitions

    def ref(self, name: str) -> str:
        mod = self.names.get(name)
        if mod is None:
            raise KeyError(name)
        if mod:
            self.used_imports.setdefault(mod, set()).add(name)
        return name

    def has(self, name: str) -> bool:
        return name in self.names

    def py(self, t: CType, ctx: str = "arg", hint: str = "") -> str:
        """The ctypes expression for ``t`` (kept in step with TypeRules.key)."""
        api = self.api
        if t.kind == "name":
            if t.name in _CTYPES_LIBC:
                return _CTYPES_LIBC[t.name]
            if t.name in _CTYPES_BUILTIN:
                return _CTYPES_BUILTIN[t.name]
            if t.name == "void":
                return "None"
            if t.name in api.typedefs and self.has(t.name) and not (ctx == "cbret" and self._is_ptr(t)):
                return self.ref(t.name)
            return self.py(api.resolve(t), ctx, hint)
        if t.kind == "enum":
            return "ctypes.c_int"
        if t.kind in ("struct", "union"):
            if t.members is not None:
                return self.anon_union(t, hint)
            if t.name not in self.rules.mirrored:
                raise ValueError(f"struct {t.name} passed by value but not mirrored")
            return self.ref(class_name(api, t.name))
        if t.kind == "array":
            assert t.to is not None
            return f"({self.py(t.to, 'field', hint)} * {t.length})"
        if t.kind == "func":
            return self.callback(t, hint)
        if t.kind == "ptr":
            assert t.to is not None
            to = api.resolve(t.to)
            if to.kind == "func":
                if t.to.kind == "name" and self.has(t.to.name):
                    return self.ref(t.to.name)
                return self.callback(to, hint)
            if ctx == "cbret":
                return "ctypes.c_void_p"
            if to.kind == "name" and to.name == "char" and not (t.to.kind == "name" and t.to.name in LIBC_TYPEDEFS):
                return "ctypes.c_char_p"
            if to.kind == "name" and to.name in ("void", "FILE"):
                return "ctypes.c_void_p"
            if to.kind in ("struct", "union") and to.members is None:
                if to.name not in self.rules.mirrored:
                    return self.ref(f"{to.name}_p") if self.has(f"{to.name}_p") else "ctypes.c_void_p"
                cn = class_name(api, to.name)
                if self.has(f"{cn}_p"):
                    return self.ref(f"{cn}_p")
                return f"ctypes.POINTER({self.ref(cn)})"
            return f"ctypes.POINTER({self.py(t.to, 'field', hint)})"
        raise ValueError(f"unsupported type {t}")

    def _is_ptr(self, t: CType) -> bool:
        return self.api.resolve(t).kind == "ptr" and self.api.resolve(self.api.resolve(t).to).kind != "func"

    def callback(self, f: CType, hint: str) -> str:
        assert f.to is not None
        ret = self.api.resolve(f.to)
        if ret.kind in ("struct", "union") or f.variadic:
            return "ctypes.c_void_p"  # ctypes cannot make callbacks returning structs
        args = ", ".join(self.py(t, "cbarg", hint) for _, t in f.params)
        expr = f"ctypes.CFUNCTYPE({self.py(f.to, 'cbret', hint)}{', ' if args else ''}{args})"
        if hint:
            name = hint
            if name not in self.names:
                self.anon.append(f"{name} = {expr}")
                self.names[name] = ""
            return name
        return expr

    def anon_union(self, t: CType, hint: str) -> str:
        name = hint or "anonymous"
        assert t.members is not None
        base = "ctypes.Union" if t.kind == "union" else "ctypes.Structure"
        fields = "".join(f'        ("{n}", {self.py(mt, "field", f"{name}_{n}")}),\n' for n, mt in t.members)
        self.anon.append(f"\nclass {name}({base}):\n    \"\"\"Anonymous {t.kind} member.\"\"\"\n\n    _fields_ = [\n"
                         f"{fields}    ]\n")
        self.names[name] = ""
        return name


def _doc(text: str) -> str:
    text = text.replace("\\", "\\\\").replace('"""', "'''").rstrip()
    if text.endswith('"'):
        text = text[:-1] + '\\"'
    return text


def _close(doc: str) -> str:
    """A multi-line docstring closes on its own line."""
    return doc + "\n    " if "\n" in doc else doc


def _param_name(n: str) -> str:
    return n + "_" if keyword.iskeyword(n) or n in ("self",) else n


def _sorted_structs(api: Api, names: list[str]) -> list[str]:
    """By-value dependency order (pointers do not constrain: all classes are declared first)."""
    order: list[str] = []
    seen: set[str] = set()

    def deps(t: CType) -> list[str]:
        t = api.resolve(t)
        if t.kind in ("struct", "union"):
            if t.members is not None:
                return [d for _, mt in t.members for d in deps(mt)]
            return [t.name]
        if t.kind == "array" and t.to is not None:
            return deps(t.to)
        return []

    def visit(n: str) -> None:
        if n in seen or n not in names:
            return
        seen.add(n)
        for _, ft in api.structs[n].fields:
            for d in deps(ft):
                visit(d)
        order.append(n)

    for n in names:
        visit(n)
    return order


def generate_module(api: Api, spec: ModuleSpec, names: dict[str, str]) -> str:
    rules = type_rules(api)
    em = Emitter(api, spec, rules, names)
    hs = set(spec.headers)

    # constants
    consts: list[str] = []
    for d in sorted((d for d in api.defines.values() if d.header in (spec.define_headers or spec.headers)),
                    key=lambda d: (spec.headers.index(d.header) if d.header in spec.headers else 99, d.line)):
        consts.append(f"{d.name} = {d.value!r}" if isinstance(d.value, str) else
                      f"{d.name} = {_int_literal(d.value)}")
        names[d.name] = ""
    enums: list[str] = []
    for e in api.enums:
        if e.header not in hs:
            continue
        enums.append(f"\n# enum {e.name or '(anonymous)'} ({e.header}:{e.line})")
        for n, v in e.items:
            enums.append(f"{n} = {v}")
            names[n] = ""

    # scalar / pointer typedefs and opaque pointer aliases
    aliases: list[str] = []
    for s in sorted(n for n, h in api.opaque_headers.items() if h in hs and n in api.opaque):
        aliases.append(f"{s}_p = ctypes.c_void_p  # struct {s} * (opaque)")
        names[f"{s}_p"] = ""
    structs = [s.name for s in api.structs.values()
               if s.header in hs and (spec.structs is None or s.name in spec.structs) and s.name in rules.mirrored]
    if spec.optional_headers:
        structs += [s.name for s in api.structs.values() if s.header in spec.optional_headers]
    for s in structs:
        names[class_name(api, s)] = ""

    callbacks: list[tuple[str, CType]] = []
    for td in api.typedefs.values():
        if td.header not in hs or td.name in names:
            continue
        t = td.type
        r = api.resolve(t)
        if r.kind == "ptr" and r.to is not None and api.resolve(r.to).kind == "func":
            callbacks.append((td.name, t))
            continue
        if r.kind in ("struct", "union") and r.members is None:
            if r.name in rules.mirrored and class_name(api, r.name) != td.name:
                aliases.append(f"{td.name} = {class_name(api, r.name)}")
                names[td.name] = ""
            continue
        if r.kind in ("struct", "union", "enum"):
            continue  # anonymous struct typedefs (ggml_bf16_t) and enum typedefs: not needed
        aliases.append(f"{td.name} = {em.py(t, 'field')}  # {t.declare(td.name)}")
        names[td.name] = ""

    # struct declarations (fields assigned below, in by-value dependency order)
    decls: list[str] = []
    for s in structs:
        st = api.structs[s]
        base = "ctypes.Structure" if st.kind == "struct" else "ctypes.Union"
        doc = f"{st.kind} {s} ({st.header}:{st.line})"
        if st.comment:
            doc += "\n\n    " + _doc(st.comment).replace("\n", "\n    ")
        cn = class_name(api, s)
        decls.append(f"\nclass {cn}({base}):\n    \"\"\"{_close(doc)}\"\"\"\n\n    _c_name_ = {s!r}\n\n")
    for s in structs:
        cn = class_name(api, s)
        decls.append(f"{cn}_p = ctypes.POINTER({cn})")
        names[f"{cn}_p"] = ""

    cb_lines: list[str] = []
    for name, t in callbacks:
        r = api.resolve(t)
        assert r.to is not None
        names[name] = ""
        em_expr = em.callback(api.resolve(r.to), "")
        cb_lines.append(f"{name} = {em_expr}  # {t.declare(name) if t.kind != 'name' else name}")

    field_lines: list[str] = []
    for s in _sorted_structs(api, structs):
        st = api.structs[s]
        cn = class_name(api, s)
        rows = []
        anonymous: list[str] = []
        n_anon = sum(1 for fname, _ in st.fields if not fname)
        for i, (fname, ft) in enumerate(st.fields):
            pyname = fname or ("value" if n_anon == 1 else f"u{i}")
            if not fname:
                anonymous.append(pyname)
            expr = em.py(ft, "field", f"{cn}_{pyname}")
            rows.append(f"    ({pyname!r}, {expr}),  # {ft.declare(fname)}")
        if anonymous:
            field_lines.append(f"{cn}._anonymous_ = {tuple(anonymous)!r}")
        field_lines.append(f"{cn}._fields_ = [\n" + "\n".join(rows) + "\n]\n")

    # functions
    fn_lines: list[str] = []
    fns = [f for f in api.functions.values() if f.header in hs and f.name not in EXCLUDED
           and (spec.functions is None or f.name in spec.functions)]
    if spec.functions is not None:
        order = {n: i for i, n in enumerate(spec.functions)}
        fns.sort(key=lambda f: (spec.headers.index(f.header), f.line) if f.header in spec.headers else (99, order[f.name]))
    for f in fns:
        fn_lines.append(function_stub(em, f, spec.library))
    opt_lines: list[str] = []
    for f in api.functions.values():
        if f.header in spec.optional_headers and f.name not in EXCLUDED:
            opt_lines.append(function_stub(em, f, spec.library, optional=True))

    head = [
        f'"""Low-level ctypes bindings for {spec.title}, name for name.',
        "",
        "Generated by build_tools/bindgen.py from the vendored llama.cpp headers: do not edit by hand;",
        "run `python -m build_tools.bindgen` after the headers change (see `python -m build_tools bump`).",
        "Functions bind lazily (see llama_cpp._native.ctypes_util): importing this module loads no library.",
        "Opaque pointers are ints (None for NULL); pointers to mirrored structs are ctypes pointers.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "import ctypes",
        "",
        "from ._native.ctypes_util import BindingSet, library_attributes",
    ]
    for mod in spec.imports:
        used = sorted(em.used_imports.get(mod, ()))
        if used:
            head.append(f"from .{mod} import (\n" + "".join(f"    {n},\n" for n in used) + ")")
    head += ["", "__bindings__ = BindingSet(__name__, globals())", "_api = __bindings__",
             f"__getattr__ = library_attributes(__name__, {spec.library!r}, {LIBRARY_ALIASES[spec.name]!r})", ""]

    body: list[str] = []
    if consts:
        body += ["", "# " + "-" * 70, "# #define constants", "# " + "-" * 70, *consts]
    if enums:
        body += ["", "# " + "-" * 70, "# enums (C enums are int-sized: ctypes.c_int)", "# " + "-" * 70, *enums]
    body += ["", "# " + "-" * 70, "# typedefs and opaque pointer types", "# " + "-" * 70, *aliases]
    if decls:
        body += ["", "# " + "-" * 70, "# structs (fields assigned below, once every type they use exists)",
                 "# " + "-" * 70, "", *decls]
    if cb_lines or em.anon:
        body += ["", "# " + "-" * 70, "# callback types", "# " + "-" * 70, *cb_lines]
    body += ["", "# " + "-" * 70, "# struct fields", "# " + "-" * 70]
    fields_block = "\n".join(field_lines)
    body += ["__FIELDS__"]
    body += ["", "# " + "-" * 70, "# functions", "# " + "-" * 70, "", *fn_lines]
    if opt_lines:
        body += ["", "# " + "-" * 70,
                 "# optional C++ staging API (src/llama-ext.h), resolved by mangled name: Itanium, then MSVC",
                 "# " + "-" * 70, "", *opt_lines,
                 "def optional_symbols() -> dict[str, bool]:",
                 '    """Optional (staging) function name -> whether the loaded library exports it (loads it)."""',
                 "    return {f.__name__: f.available() for f in __bindings__.optionals()}", ""]
    text = "\n".join(head + body) + "\n"
    # anonymous types (inline callback and union types) go just before the fields using them
    text = text.replace("__FIELDS__", ("\n\n".join(em.anon) + "\n\n" if em.anon else "") + fields_block)
    return _tidy(text)


def _tidy(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    blank = 0
    for line in lines:
        line = line.rstrip()
        if not line:
            blank += 1
            if blank > 2:
                continue
        else:
            blank = 0
        out.append(line)
    return "\n".join(out).strip("\n") + "\n"


def _int_literal(v: int) -> str:
    return hex(v) if v > 0xFFFF else str(v)


def function_stub(em: Emitter, f: Function, library: str, optional: bool = False) -> str:
    args = [em.py(t, "arg", f"{f.name}_{n}") for n, t in f.params]
    ret = em.py(f.ret, "ret", f"{f.name}_ret")
    params = ", ".join(_param_name(n) for n, _ in f.params)
    sig = f.signature()
    doc = sig
    if f.comment:
        doc += "\n\n    " + _doc(f.comment).replace("\n", "\n    ")
    if f.deprecated:
        doc += f"\n\n    Deprecated: {f.deprecated}."
    argl = "[" + ", ".join(args) + "]"
    if optional:
        syms = (itanium_name(em.api, f), msvc_name(em.api, f))
        deco = f"@_api.optional({library!r}, {syms!r}, {argl}, {ret})"
    else:
        extra = f", deprecated={f.deprecated!r}" if f.deprecated else ""
        deco = f"@_api.function({library!r}, {argl}, {ret}{extra})"
    if len(deco) > 110:
        deco = deco.replace(f"{argl}", "[\n    " + ",\n    ".join(args) + ",\n]") if args else deco
    slash = ", /" if params else ""
    return f"{deco}\ndef {f.name}({params}{slash}):\n    \"\"\"{_close(doc)}\"\"\"\n\n"


def generate_all(api: Api | None = None) -> dict[str, str]:
    """Module stem -> generated source, for every module of :func:`module_specs`."""
    api = api or parse_api()
    names: dict[str, str] = {}  # python name -> module defining it
    out: dict[str, str] = {}
    for spec in module_specs(api):
        view = {n: m for n, m in names.items() if m in spec.imports}
        out[spec.name] = generate_module(api, spec, view)
        for n, m in view.items():
            if m == "":
                names[n] = spec.name
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m build_tools.bindgen", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the committed modules differ")
    p.add_argument("--root", type=Path, help="llama.cpp tree (default vendor/llama.cpp)")
    args = p.parse_args(argv)
    modules = generate_all(parse_api(args.root))
    stale = []
    for name, text in modules.items():
        path = PKG / f"{name}.py"
        old = path.read_text() if path.exists() else None
        if old != text:
            stale.append(name)
            if not args.check:
                path.write_text(text)
    if args.check:
        if stale:
            print("stale generated modules: " + ", ".join(stale), file=sys.stderr)
            return 1
        return 0
    for name in modules:
        print(f"{'wrote' if name in stale else 'unchanged'} llama_cpp/{name}.py")
    return 0


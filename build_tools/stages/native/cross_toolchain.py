"""A cross build's compiler and its CMake toolchain file, generated from ``[config.cross]``.

The compilers come from the system's package manager (Debian's ``g++-aarch64-linux-gnu``, and
``clang-19`` where the configuration asks for clang: it knows ``-march=armv9.2-a+sme``, bookworm's
cross GCC 12 does not); installed here when missing and running as root. Their versions enter the content key (the
host compiler's do not: it compiles nothing that is shipped). The toolchain file holds paths, so
it lives in the cache, named by the hash of its text, and never enters the key itself.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...common import fsutil, proc, syspkg
from ...common.paths import cache_root
from ...errors import ToolNotFoundError
from ...inputs.configs import CrossSpec

# The newest -march each CPU-variant family asks for under GGML_CPU_ALL_VARIANTS (ggml-cpu's
# CMakeLists.txt: the armv9.2 variants add +sme). A compiler that lacks it fails mid-build.
_ALL_VARIANTS_PROBE = {"aarch64": "-march=armv9.2-a+dotprod+fp16+sve+i8mm+sve2+sme"}
# On Windows (LLP64) the sapphirerapids variant's AMX tile loads must assemble with a 64-bit stride:
# GCC 12's amxtileintrin.h casts it to long, 32 bits there, and the assembler refuses the result.
_AMX_PROBE = """#include <immintrin.h>
void probe(const void *p, long long stride) { _tile_loadd(0, p, stride); }
"""


@dataclass(frozen=True)
class CrossToolchain:
    cc: Path
    cxx: Path
    toolchain_file: Path
    versions: dict[str, str]

    def cmake_defines(self) -> dict[str, str]:
        return {"CMAKE_TOOLCHAIN_FILE": str(self.toolchain_file),
                "CMAKE_C_COMPILER": str(self.cc), "CMAKE_CXX_COMPILER": str(self.cxx)}


def toolchain_file_text(spec: CrossSpec, cc: Path, cxx: Path) -> str:
    """The CMake toolchain file: target system, compilers, and a find root that sees only the
    target's sysroot for libraries and headers (host programs such as git stay usable)."""
    sysroot = Path("/usr") / spec.triple
    # clang finds the GNU cross toolchain (crt files, libstdc++, aarch64-linux-gnu-ld) from --target.
    target = ([f"set(CMAKE_C_COMPILER_TARGET {spec.triple})", f"set(CMAKE_CXX_COMPILER_TARGET {spec.triple})"]
              if spec.uses_clang else [])
    if spec.system_name == "Windows":  # CMake enables RC for Windows targets; MinGW's windres is its compiler
        target.append(f'set(CMAKE_RC_COMPILER "{cc.parent / (spec.triple + "-windres")}")')
    return "\n".join([
        f"set(CMAKE_SYSTEM_NAME {spec.system_name})",
        f"set(CMAKE_SYSTEM_PROCESSOR {spec.system_processor})",
        f'set(CMAKE_C_COMPILER "{cc}")',
        f'set(CMAKE_CXX_COMPILER "{cxx}")',
        *target,
        f'set(CMAKE_FIND_ROOT_PATH "{sysroot}")',
        "set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)",
        "set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)",
        "set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)",
        "set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)",
        "",
    ])


def compiler_names(spec: CrossSpec) -> tuple[str, str]:
    """The C and C++ compiler programs of ``spec``: ``aarch64-linux-gnu-gcc``, ``clang-19``, or
    ``x86_64-w64-mingw32-gcc-posix`` (a MinGW-w64 thread model)."""
    if spec.uses_clang:
        version = spec.compiler[len("clang"):]
        return f"clang{version}", f"clang++{version}"
    model = spec.compiler[len("gcc"):]
    return f"{spec.triple}-gcc{model}", f"{spec.triple}-g++{model}"


def _compiler(name: str, packages: tuple[str, ...]) -> Path:
    found = shutil.which(name)
    if found is None:
        raise ToolNotFoundError(f"{name} is not on PATH although {', '.join(packages)} are "
                                "installed: add the package that provides it to [config.cross]")
    return Path(found)


def check_all_variants(spec: CrossSpec, cc: Path) -> None:
    """Refuse a compiler that cannot build every CPU variant, before a long build fails on it."""
    target = [f"--target={spec.triple}"] if spec.uses_clang else []
    if spec.system_name == "Windows" and spec.system_processor == "x86_64":
        _check_amx(spec, cc, target)
    flag = _ALL_VARIANTS_PROBE.get(spec.system_processor)
    if flag is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text("int main(void) { return 0; }\n")
        done = proc.run([cc, *target, flag, "-c", src, "-o", Path(tmp) / "probe.o"], check=False)
    if done.returncode != 0:
        raise ToolNotFoundError(
            f"{cc} does not accept {flag} (needed by the armv9.2 variants of GGML_CPU_ALL_VARIANTS): "
            "use a compiler that knows SME in [config.cross] (compiler = \"clang-19\" with clang-19 in "
            f"its packages, or GCC >= 14: g++-14-{spec.triple}), or cpu_variants = \"single\"")


def _check_amx(spec: CrossSpec, cc: Path, target: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "amx.c"
        src.write_text(_AMX_PROBE)
        done = proc.run([cc, *target, "-O2", "-mamx-tile", "-c", src, "-o", Path(tmp) / "amx.o"], check=False)
    if done.returncode != 0:
        raise ToolNotFoundError(
            f"{cc} cannot build the sapphirerapids (AMX) variant of GGML_CPU_ALL_VARIANTS for Windows (GCC "
            "before 13 emits 32-bit index registers for AMX tile loads there): use compiler = \"clang-19\" "
            "with clang-19 in [config.cross]'s packages, or cpu_variants = \"single\"")


def provision(spec: CrossSpec, *, all_variants: bool, install: bool = True) -> CrossToolchain:
    """Make sure the cross compiler is installed; write the toolchain file; return it with the
    versions for the key."""
    mgr = syspkg.manager()
    if mgr is None or not spec.packages(mgr):
        raise ToolNotFoundError(f"the {spec.triple} cross build needs apt or dnf to install its compiler "
                                "([config.cross] in manifests/configs.toml), or install it by hand")
    packages = spec.packages(mgr)
    got = syspkg.ensure(mgr, packages, why=f"the {spec.triple} cross build", install=install)
    cc, cxx = (_compiler(name, packages) for name in compiler_names(spec))
    if all_variants:
        check_all_variants(spec, cc)
    versions = {f"{mgr}:{p}": v for p, v in got.items()}
    for label, exe in (("cc", cc), ("cxx", cxx)):
        out = proc.run([exe, "--version"], what=f"{exe.name} --version", error=ToolNotFoundError).stdout
        versions[label] = out.splitlines()[0].strip() if out else "unknown"
    versions["machine"] = spec.system_processor
    versions["system"] = spec.system_name
    versions["cross"] = spec.triple
    text = toolchain_file_text(spec, cc, cxx)
    path = cache_root() / "toolchains" / f"cross-{spec.triple}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.cmake"
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        fsutil.write_text_atomic(path, text)
    return CrossToolchain(cc, cxx, path, versions)

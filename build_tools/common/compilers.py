"""Find the build tools (CMake, Ninja, compilers) and record their versions for the content key."""

from __future__ import annotations

import logging
import os
import platform
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import NativeBuildError, ToolNotFoundError
from . import pip, proc
from .paths import cache_root

log = logging.getLogger(__name__)

MIN_CMAKE = (3, 18)
PYPI_CMAKE = "cmake>=3.28,<4"
PYPI_NINJA = "ninja>=1.11"


@dataclass(frozen=True)
class Toolchain:
    cmake: Path
    ninja: Path
    cc: Path
    cxx: Path
    versions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "cmake": str(self.cmake),
            "ninja": str(self.ninja),
            "cc": str(self.cc),
            "cxx": str(self.cxx),
            "versions": dict(sorted(self.versions.items())),
        }


def _first_line(cmd: list[str]) -> str:
    out = proc.run(cmd, error=NativeBuildError).stdout
    return out.strip().splitlines()[0] if out.strip() else ""


def _version_tuple(text: str) -> tuple[int, ...]:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(x) for x in m.groups() if x is not None) if m else ()


def _pypi_tools_dir() -> Path:
    return cache_root() / "tools" / f"py{sys.version_info.major}{sys.version_info.minor}"


def _from_pypi(requirement: str, exe: str) -> Path:
    """Install ``requirement`` from the package index into the cache and return its executable."""
    target = _pypi_tools_dir()
    # pip's --prefix puts console scripts in Scripts\ with an .exe suffix on Windows
    found = target / "Scripts" / f"{exe}.exe" if os.name == "nt" else target / "bin" / exe
    if found.exists():
        return found
    log.info("%s not found on PATH (or too old): installing %s from the package index", exe, requirement)
    done = proc.run(pip.install_prefix(requirement, target), check=False)
    if done.returncode != 0 or not found.exists():
        raise NativeBuildError(
            f"could not install {requirement} from the package index: {proc.tail(done)}\n"
            f"Install {exe} yourself and put it on PATH."
        )
    return found


def find_cmake() -> Path:
    path = os.environ.get("CMAKE") or shutil.which("cmake")
    if path and _version_tuple(_first_line([path, "--version"])) >= MIN_CMAKE:
        return Path(path)
    return _from_pypi(PYPI_CMAKE, "cmake")


def find_ninja() -> Path:
    path = os.environ.get("NINJA") or shutil.which("ninja")
    if path:
        return Path(path)
    return _from_pypi(PYPI_NINJA, "ninja")


C_COMPILERS = ("cc", "gcc", "clang")
CXX_COMPILERS = ("c++", "g++", "clang++")


def find_compiler(env: str = "CC", names: tuple[str, ...] = C_COMPILERS, *, hint: str = "") -> Path:
    """The compiler ``$env`` names, else the first of ``names`` on PATH: the one compiler finder."""
    explicit = os.environ.get(env)
    candidates = [explicit] if explicit else list(names)
    for name in candidates:
        found = shutil.which(name)
        if found:
            return Path(found)
    raise ToolNotFoundError(
        f"no {env} compiler found (tried {', '.join(candidates)}); install gcc/g++ (or clang) "
        f"or set {env} to the compiler's path" + (f"; {hint}" if hint else "")
    )


def detect() -> Toolchain:
    cmake, ninja = find_cmake(), find_ninja()
    cc, cxx = find_compiler("CC", C_COMPILERS), find_compiler("CXX", CXX_COMPILERS)
    versions = {
        "cmake": _first_line([str(cmake), "--version"]),
        "ninja": _first_line([str(ninja), "--version"]),
        "cc": _first_line([str(cc), "--version"]),
        "cxx": _first_line([str(cxx), "--version"]),
        "machine": platform.machine(),
        "system": platform.system(),
    }
    libc = platform.libc_ver()
    if libc[0]:
        versions["libc"] = f"{libc[0]} {libc[1]}"
    return Toolchain(cmake=cmake, ninja=ninja, cc=cc, cxx=cxx, versions=versions)

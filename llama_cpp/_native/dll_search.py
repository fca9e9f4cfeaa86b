"""Where Windows looks for our DLLs' dependencies, and which dependency is missing when a load fails.

On Windows a DLL's dependencies resolve from the directories given to ``os.add_dll_directory``
and the system directories (Python 3.8+ no longer searches ``PATH`` or the current directory for
them). We add the package's ``lib\\`` and, for a CUDA backend, the ``bin`` folders of NVIDIA's
runtime wheels: CUDA 12 wheels put ``cudart64_12.dll`` in ``nvidia\\cuda_runtime\\bin`` and
``cublas64_12.dll`` in ``nvidia\\cublas\\bin``; CUDA 13 wheels put everything under
``nvidia\\cu13\\bin\\x86_64`` (as the pinned 13.0 wheels and later ones do; ``bin\\x64`` and
``bin`` are searched too, for other builds). ``nvcuda.dll`` is the driver's
and lives in System32. The current directory is never added. To name a missing DLL, the folders
Windows searches on its own count as well: the interpreter's (CPython's ``vcruntime140.dll``) and
the system folders.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .binfmt import read_dependencies
from .sites import site_dirs

# NVIDIA runtime wheels' DLL folders, relative to site-packages (both CUDA majors' layouts).
NVIDIA_DLL_DIRS = (
    "nvidia/cu13/bin/x86_64", "nvidia/cu13/bin/x64", "nvidia/cu13/bin",
    "nvidia/cuda_runtime/bin", "nvidia/cublas/bin", "nvidia/cuda_nvrtc/bin", "nvidia/nvjitlink/bin",
)

# Why a dependency may be missing, for the usual suspects (matched against the file name).
_HINTS = (
    (re.compile(r"^(libcuda\.so|nvcuda\.dll$)", re.I), "NVIDIA driver not installed"),
    (re.compile(r"^(lib)?(cudart|cublas|cublasLt)(64_\d+\.dll$|\.so|\.\d+\.dylib$)", re.I),
     "CUDA runtime not installed: install the package's nvidia-* wheels"),
    (re.compile(r"^(libvulkan\.(so|\d+\.dylib|dylib)|vulkan-1\.dll$)", re.I), "Vulkan loader not installed"),
    (re.compile(r"^libMoltenVK", re.I), "MoltenVK (the Vulkan driver for macOS) not installed"),
    (re.compile(r"^(libgomp\.so|libomp\.dylib|vcomp\d+\.dll$|libgomp-1\.dll$)", re.I),
     "OpenMP runtime not installed"),
    (re.compile(r"^(msvcp\d+|vcruntime\d+(_\d+)?|concrt\d+)\.dll$", re.I),
     "Microsoft Visual C++ runtime not installed (install the VC++ 2015-2022 redistributable)"),
    (re.compile(r"^(libstdc\+\+-6|libgcc_s_seh-1|libwinpthread-1)\.dll$", re.I),
     "MinGW runtime DLL missing (the wheel should bundle it: reinstall llama-cpp-python)"),
    (re.compile(r"^(libamdhip64\.so|libhipblas\.so|librocblas\.so|amdhip64(_\d+)?\.dll$)", re.I),
     "ROCm runtime not installed"),
)


def hint(library: str) -> str:
    """What a missing ``library`` usually means, as a short fix."""
    name = library.replace("\\", "/").rsplit("/", 1)[-1]
    for pat, text in _HINTS:
        if pat.search(name):
            return text
    return "a dependency of the library is not installed"


def nvidia_dll_dirs(sites: Iterable[Path]) -> list[Path]:
    """The existing DLL folders of NVIDIA's runtime wheels under ``sites``."""
    found = []
    for s in sites:
        for rel in NVIDIA_DLL_DIRS:
            d = Path(s) / rel
            if d.is_dir() and any(d.glob("*.dll")) and d not in found:
                found.append(d)
    return found


# delvewheel's folder beside the package: the C/C++ runtime DLLs the wheel's repair grafted.
GRAFT_DIR = "llama_cpp_python.libs"


def dll_directories(lib_dir: Path, *, cuda: bool, sites: Iterable[Path] | None = None) -> list[Path]:
    """The folders to give ``os.add_dll_directory``: ours first (``lib\\``, then the runtime that
    delvewheel grafted beside the package), then NVIDIA's for a CUDA backend."""
    dirs = [lib_dir]
    grafts = Path(lib_dir).parent.parent / GRAFT_DIR
    if grafts.is_dir():  # a repaired Windows wheel; also searched when a load error is explained
        dirs.append(grafts)
    if cuda:
        dirs += nvidia_dll_dirs(site_dirs() if sites is None else sites)
    return dirs


def add_dll_directories(dirs: Sequence[Path], add: Callable[[str], Any] | None = None) -> list[Any]:
    """``os.add_dll_directory`` each folder (absolute); returns the handles (keep them alive)."""
    adder = add if add is not None else getattr(os, "add_dll_directory")  # noqa: B009 - Windows only
    return [adder(str(Path(d).resolve())) for d in dirs]


def _interpreter_dirs() -> list[Path]:
    """The folder of the python.exe this process runs (a venv's launcher starts its base
    installation's) and the base installation: Windows searches the program's folder for every
    DLL, and CPython keeps ``vcruntime140.dll`` there. Only absolute paths: never the current directory."""
    exe = getattr(sys, "_base_executable", None) or sys.executable
    found: list[Path] = []
    for d in (os.path.dirname(exe) if exe else "", sys.base_prefix):
        if d and os.path.isabs(d) and Path(d) not in found:
            found.append(Path(d))
    return found


def _system_dirs() -> list[Path]:
    """Where a DLL that no ``os.add_dll_directory`` folder holds may still come from."""
    root = Path(os.environ.get("SystemRoot", r"C:\Windows"))
    return [*_interpreter_dirs(), root / "System32", root]


def missing_windows_dependency(path: Path, search: Sequence[Path],
                               system: Sequence[Path] | None = None) -> str | None:
    """The first DLL that ``path`` imports and none of ``search`` (or the system folders) holds.

    API sets (``api-ms-win-*``, ``ext-ms-*``) are resolved by Windows itself and never missing;
    a dependency that is itself one of our files is checked in turn (``ggml-cuda.dll`` →
    ``ggml-base.dll`` → ...), so the name reported is the one that is really absent.
    """
    # Windows file names are case-insensitive: one lowercase index per folder, the first folder wins
    found_in: dict[str, Path] = {}
    for d in reversed([*search, *(_system_dirs() if system is None else system)]):
        try:
            found_in.update({e.name.lower(): e for e in Path(d).iterdir() if e.is_file()})
        except OSError:
            continue
    seen: set[str] = set()

    def locate(name: str) -> Path | None:
        return found_in.get(name.lower())

    def walk(p: Path) -> str | None:
        try:
            deps = read_dependencies(p)
        except (OSError, ValueError):
            return None
        for name in deps.needed:
            key = name.lower()
            if key in seen or key.startswith(("api-ms-win-", "ext-ms-")):
                continue
            seen.add(key)
            found = locate(name)
            if found is None:
                return name
            if found.parent in [Path(d) for d in search]:
                deeper = walk(found)
                if deeper is not None:
                    return deeper
        return None

    return walk(path)


_LINUX_MISSING = re.compile(r"([\w.+-]+\.(?:so[\w.]*|dll|dylib)): cannot open shared object file")
_DARWIN_MISSING = re.compile(r"Library not loaded: (\S+)")
_WINDOWS_MISSING = re.compile(r"Could not find module '([^']+)'")


def explain_load_error(message: str, path: Path | None = None, *, platform: str = sys.platform,
                       search: Sequence[Path] = (), system: Sequence[Path] | None = None) -> str:
    """A loader error as "<library> not found (<why>)" when a missing dependency can be named."""
    m = _LINUX_MISSING.search(message) or _DARWIN_MISSING.search(message)
    if m:
        lib = m.group(1).rsplit("/", 1)[-1]
        return f"{lib} not found ({hint(lib)})"
    if platform == "win32" and _WINDOWS_MISSING.search(message) and path is not None:
        missing = missing_windows_dependency(path, search or [path.parent], system)
        if missing is not None:
            return f"{missing} not found ({hint(missing)})"
        return f"{path.name} or one of its dependencies could not be loaded (a DLL it needs is not installed)"
    m = re.search(r"undefined symbol: (\S+)|Symbol not found: (\S+)", message)
    if m:
        sym = m.group(1) or m.group(2)
        return f"undefined symbol {sym} (the backend does not match libggml: mixed builds?)"
    return message.strip()

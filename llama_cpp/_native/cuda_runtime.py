"""Find the CUDA runtime a CUDA wheel's backend needs, from NVIDIA's wheels, and preload it.

CUDA wheels of llama_cpp do not bundle ``libcudart``/``libcublas``: they depend on NVIDIA's
runtime wheels, which install into site-packages in one of two layouts:

* CUDA 13 (``nvidia-cuda-runtime``, ``nvidia-cublas``): ``nvidia/cu13/lib/libcudart.so.13`` ...
* CUDA 12 (``nvidia-cuda-runtime-cu12``, ``nvidia-cublas-cu12``): ``nvidia/cuda_runtime/lib/``
  and ``nvidia/cublas/lib/``.

The dynamic loader searches neither, so before the CUDA backend is loaded :func:`preload` opens
each library with ``RTLD_GLOBAL`` in dependency order; the backend's NEEDED entries then resolve
to the already-loaded objects by SONAME. The driver (``libcuda.so.1``) comes with the GPU's
kernel module, never from a wheel.

Nothing here runs at import time.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .elf import read_dynamic
from .sites import ENV_LIB_PATH, PACKAGE_LIB_DIR, site_dirs

log = logging.getLogger(__name__)


# Libraries in load order (a library only needs the ones before it) and where each CUDA
# major's wheels put them, with the wheel to install when one is missing.
_LIBS = ("cudart", "cublasLt", "cublas")
_LAYOUTS: dict[int, dict[str, tuple[str, str]]] = {
    13: {
        "cudart": ("nvidia/cu13/lib", "nvidia-cuda-runtime"),
        "cublasLt": ("nvidia/cu13/lib", "nvidia-cublas"),
        "cublas": ("nvidia/cu13/lib", "nvidia-cublas"),
    },
    12: {
        "cudart": ("nvidia/cuda_runtime/lib", "nvidia-cuda-runtime-cu12"),
        "cublasLt": ("nvidia/cublas/lib", "nvidia-cublas-cu12"),
        "cublas": ("nvidia/cublas/lib", "nvidia-cublas-cu12"),
    },
}
_CUDART_NEEDED = re.compile(r"^libcudart\.so\.(\d+)$")


def soname(lib: str, major: int) -> str:
    return f"lib{lib}.so.{major}"


def wheel_for(lib: str, major: int) -> str:
    """The NVIDIA wheel that provides ``lib`` for CUDA ``major`` (a pip requirement)."""
    layout = _LAYOUTS.get(major)
    if layout is None:
        raise ValueError(f"CUDA {major} is not supported (known: {sorted(_LAYOUTS)})")
    return f"{layout[lib][1]}>={major},<{major + 1}"


@dataclass(frozen=True)
class RuntimeLibrary:
    name: str  # "cudart", "cublasLt", "cublas"
    soname: str
    path: Path | None  # where it was found in site-packages; None: not in any wheel
    wheel: str  # the requirement that provides it


@dataclass
class PreloadReport:
    """What :func:`preload` did: the libraries it loaded, and those it could not."""

    major: int
    loaded: dict[str, str] = field(default_factory=dict)  # soname -> path (or "system")
    missing: dict[str, str] = field(default_factory=dict)  # soname -> reason, with the fix

    @property
    def ok(self) -> bool:
        return not self.missing

    def message(self) -> str:
        if self.ok:
            return f"CUDA {self.major} runtime: " + ", ".join(f"{k} ({v})" for k, v in self.loaded.items())
        return "; ".join(f"{k}: {v}" for k, v in self.missing.items())


def find_runtime(major: int, dirs: Sequence[Path] | None = None) -> list[RuntimeLibrary]:
    """Locate each runtime library of CUDA ``major`` in NVIDIA's wheels (load order)."""
    layout = _LAYOUTS.get(major)
    if layout is None:
        raise ValueError(f"CUDA {major} is not supported (known: {sorted(_LAYOUTS)})")
    dirs = site_dirs() if dirs is None else list(dirs)
    out = []
    for lib in _LIBS:
        rel, _wheel = layout[lib]
        name = soname(lib, major)
        path = next((d / rel / name for d in dirs if (d / rel / name).is_file()), None)
        out.append(RuntimeLibrary(lib, name, path, wheel_for(lib, major)))
    return out


def default_backend() -> Path | None:
    """The CUDA backend file the loader will load: in ``$LLAMA_CPP_LIB_PATH`` or the package's ``lib/``."""
    override = os.environ.get(ENV_LIB_PATH)
    directory = Path(override).expanduser() if override else PACKAGE_LIB_DIR
    if not directory.is_dir():
        return None
    found = sorted(p for p in directory.iterdir() if p.name.startswith("libggml-cuda") and ".so" in p.name)
    return found[0] if found else None


def _dlopen(path: str, mode: int) -> ctypes.CDLL:
    return ctypes.CDLL(path, mode=mode)


def preload(major: int | None = None, *, backend: str | os.PathLike[str] | None = None,
            dirs: Sequence[Path] | None = None) -> PreloadReport:
    """Load the CUDA runtime libraries with ``RTLD_GLOBAL`` before the CUDA backend is loaded.

    ``major`` is the CUDA major version; without it, it is read from ``backend``'s NEEDED
    ``libcudart.so.N``. A library no wheel provides is tried by SONAME (a system install on the
    loader's path); if that fails too it is reported missing with the wheel that provides it.
    """
    if major is None:
        backend = backend if backend is not None else default_backend()
        if backend is None:
            raise ValueError(
                "preload() needs the CUDA major version or the backend library path, and no "
                f"libggml-cuda* was found in the package's lib directory (or ${ENV_LIB_PATH})"
            )
        major = cuda_major_of(backend)
    report = PreloadReport(major)
    for lib in find_runtime(major, dirs):
        target = str(lib.path) if lib.path is not None else lib.soname
        try:
            _dlopen(target, os.RTLD_GLOBAL | os.RTLD_NOW)
        except OSError as exc:
            if lib.path is None:
                report.missing[lib.soname] = f"not found: pip install '{lib.wheel}'"
            else:
                report.missing[lib.soname] = f"{lib.path} failed to load: {exc}"
            continue
        report.loaded[lib.soname] = str(lib.path) if lib.path is not None else "system"
    if report.ok:
        log.debug("%s", report.message())
    else:
        log.warning("CUDA runtime incomplete: %s", report.message())
    return report


# ---------------------------------------------------------------------------- NEEDED of a backend

def needed(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """DT_NEEDED entries of an ELF file (:func:`llama_cpp._native.elf.read_dynamic`)."""
    return read_dynamic(path).needed


def cuda_major_of(backend: str | os.PathLike[str]) -> int:
    """The CUDA major version a backend library was built against (from its NEEDED libcudart.so.N)."""
    for name in needed(backend):
        m = _CUDART_NEEDED.match(name)
        if m:
            return int(m.group(1))
    raise ValueError(f"{backend} does not link libcudart.so.N: not a CUDA backend")

r"""Provision the CUDA toolkit a CUDA configuration builds with: NVIDIA's PyPI wheels, or a system one.

``provision(spec)`` returns a :class:`CudaToolkit` whose ``versions`` enter the content key and the
native manifest, whose ``cmake_defines()`` are the path-valued ``-D`` definitions and whose ``env()``
is the extra build environment. The result is cached under ``cache_root()/cuda/<hash>/``::

    site/          pip install --target of the pinned wheels (exact pins, --no-deps)
    toolkit/       a symlink farm CMake's FindCUDAToolkit and nvcc accept as a toolkit root:
                   bin/ include/ lib64/ (lib -> lib64) nvvm/, plus lib64/stubs/libcuda.so
                   (Windows: hard links or copies, bin\ include\ lib\x64\ nvvm\, see below)
    toolkit.json   written last: its presence marks a finished, verified toolkit

created in a temporary sibling directory and renamed into place, so an interrupted run leaves
nothing half-made. The hash covers the pins (and, for a system toolkit, which nvcc it is).

Layouts: CUDA 13 wheels all install under ``nvidia/cu13/{bin,include,lib,nvvm}``; CUDA 12
wheels each under their own ``nvidia/<component>/`` (``cuda_nvcc``, ``cuda_runtime``, ``cublas``,
``cuda_cccl``). Both are merged into the same farm. nvcc locates its helpers relative to the
path it was started by (``_HERE_`` in nvcc.profile is not symlink-resolved), so ``toolkit/bin/nvcc``
as a link sees ``toolkit/`` as its ``TOP`` and finds the merged headers, libraries and ``cicc``.

Which wheels: ``nvidia-cuda-nvcc`` (13.x) declares ``nvidia-nvvm`` (cicc, libdevice),
``nvidia-cuda-crt`` (crt/ headers) and ``nvidia-cuda-runtime`` as *unpinned* dependencies, so
the configuration pins them itself and installation runs with ``--no-deps``: a toolkit never
mixes in whatever release is newest on the index. The CUDA 12 line has no complete compiler on
PyPI: ``nvidia-cuda-nvcc-cu12`` ships only ``ptxas`` and ``libnvvm`` (no nvcc driver, cicc,
cudafe++, fatbinary or nvlink), so CUDA 12 configurations use ``toolkit = "system"``, optionally
with pinned wheels that fill what the system toolkit lacks (cuBLAS, say).

libcuda stub vs ``GGML_CUDA_NO_VMM``: ggml-cuda links the driver (``CUDA::cuda_driver``) for its
virtual-memory pool, which reserves one large address range and maps physical memory into it as
the pool grows, so buffers never move and the pool does not fragment. No wheel ships
``libcuda.so`` or its stub, so a link-only stub is generated (:mod:`build_tools.cuda_stub`, SONAME
``libcuda.so.1``, never shipped); at run time the driver installed with the GPU's kernel module
is loaded. The alternative, ``no_vmm = true``, drops the driver link entirely (the backend then
needs only cudart and cuBLAS, and the NEEDED entry ``libcuda.so.1`` disappears) at the cost of
the legacy pool: separate ``cudaMalloc`` chunks, more fragmentation and memory overhead on
long-running servers. Because the driver is needed at run time anyway (cudart itself loads
``libcuda.so.1``), the stub costs nothing for users and keeps the faster pool: it is the default.

Windows (``WINDOWS`` layout, chosen on a Windows host; Ninja + nvcc with MSVC's ``cl`` as host
compiler). The toolkit root is the one NVIDIA's installer makes: ``bin\nvcc.exe`` and its
helpers, ``include\``, ``lib\x64\*.lib``, ``nvvm\``. nvcc.profile there reads ``TOP =
$(_HERE_)/..``, ``-I$(TOP)/include`` and ``/LIBPATH:$(TOP)/lib/x64``, so a root assembled
elsewhere works as long as ``nvcc.exe`` is *started from* its ``bin\``. Symlinks need a privilege
on Windows, so the root is made of hard links to the pip target (same volume), else copies (a
system toolkit on another drive); DLLs are left out: nothing loads them at build time, the
runtime comes from the user's NVIDIA wheels, and cuBLASLt's alone is 480-670 MB. What the
win_amd64 wheels carry (read from PyPI, ``unzip -l``):

====================================  ==========================================================
CUDA 13 (all under ``nvidia/cu13/``)
nvidia-cuda-nvcc 13.0.88              ``bin/nvcc.exe nvcc.profile ptxas.exe fatbinary.exe
                                      nvlink.exe cudafe++.exe bin2c.exe``, ``bin/crt/*.stub``
nvidia-nvvm 13.0.88                   ``nvvm/bin/cicc.exe``, ``nvvm/libdevice/``,
                                      ``bin/x86_64/nvvm64_40_0.dll``
nvidia-cuda-crt 13.0.88               ``include/crt/``
nvidia-cuda-runtime 13.0.96           ``include/``, ``lib/x64/{cudart,cudart_static,cuda,
                                      cudadevrt}.lib``, ``bin/x86_64/cudart64_13.dll``
nvidia-cublas 13.0.2.14               ``include/cublas*.h``, ``bin/x86_64/cublas{,Lt}64_13.dll``:
                                      **no .lib**
nvidia-cuda-cccl 13.0.85              ``include/cccl/`` (cub, thrust, libcudacxx), ``lib/cmake``
CUDA 12.8 (each under ``nvidia/<component>/``)
nvidia-cuda-nvcc-cu12 12.8.93         ``bin/ptxas.exe``, ``nvvm/bin/nvvm64_40_0.dll``,
                                      ``nvvm/libdevice``, ``include/crt``: no nvcc.exe, cicc,
                                      cudafe++, fatbinary or nvlink
nvidia-cuda-runtime-cu12 12.8.90      ``include/``, ``bin/cudart64_12.dll``: no .lib at all
nvidia-cublas-cu12 12.8.4.1           ``include/``, ``bin/cublas{,Lt}64_12.dll``: no .lib
nvidia-cuda-cccl-cu12 12.8.90         ``include/`` (cub, thrust), ``lib/cmake``
====================================  ==========================================================

(The DLLs sit in ``bin\x86_64`` in CUDA 13, never ``bin\x64``; ``bin`` in CUDA 12.) CUDA 13's
``cudart.lib`` and ``cuda.lib`` are not import libraries but static loaders (``llvm-ar t``:
``generated_cuda_runtime_api_loader.obj``, ``cuda_driverloader_*.obj``) that load ``nvcuda.dll``
from System32 at the first call: a DLL linked with them imports neither ``cudart64_13.dll`` nor
``nvcuda.dll``, only cuBLAS's DLLs show in its import table. So CUDA 13 is complete but
for cuBLAS's import libraries, which are written from the DLLs' export tables
(:func:`cuda_stub.dll_import_library`); the generated ``.lib`` names only the DLL and its
symbols, so what ggml-cuda.dll imports is fixed by the pins. CUDA 12.8 has no Windows compiler on
PyPI and stays on ``toolkit = "system"``: NVIDIA's redistributable archives (release.yml's
Windows CUDA step) carry nvcc.exe and every ``.lib``. The driver import library ``cuda.lib``
comes with the CUDA 13 runtime wheel and the archives; a toolkit without it gets one written for
``nvcuda.dll`` from :data:`cuda_stub.DRIVER_SYMBOLS` (Windows' counterpart of the libcuda stub,
kept for the same reason: the VMM pool; ``nvcuda.dll`` comes with every NVIDIA driver). The
layout and which import libraries were written enter ``versions`` (and so the content key).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...common import pip, proc
from ...common.fsutil import staging_dir, write_json_atomic
from ...common.hashing import sha256_json
from ...common.locks import exclusive
from ...common.paths import cache_root
from ...errors import NativeBuildError, ToolNotFoundError, ToolTimeoutError
from ...inputs.configs import CudaSpec
from . import cuda_stub

log = logging.getLogger(__name__)

ASSEMBLY_VERSION = "1"
"""Bump when the farm's layout changes: it enters the cache hash (not the build key)."""

STAMP = "toolkit.json"
Installer = Callable[[Sequence[str], Path], None]

# Top-level directories of a toolkit component and where they land in the farm.
_TOP_DIRS = {"bin": "bin", "include": "include", "lib": "lib64", "lib64": "lib64", "nvvm": "nvvm"}
_SKIP_NAMES = {"__init__.py", "__pycache__", ".metadata"}
_UNVERSIONED = re.compile(r"^(lib[A-Za-z0-9_+\-]+\.so)\.\d+(\.\d+)*$")
_RELEASE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")
_PIN_SPLIT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)==(.+)$")

# What a working toolkit must contain (path in the farm -> component), and the wheel that
# provides each component per CUDA major version (None: no PyPI wheel has it).
REQUIRED_FILES: dict[str, str] = {
    "bin/nvcc": "nvcc",
    "bin/ptxas": "nvcc",
    "bin/fatbinary": "nvcc",
    "bin/nvlink": "nvcc",
    "bin/cudafe++": "nvcc",
    "nvvm/bin/cicc": "nvvm",
    "nvvm/libdevice/libdevice.10.bc": "nvvm",
    "include/crt/host_config.h": "crt",
    "include/cuda_runtime.h": "runtime",
    "lib64/libcudart.so": "runtime",
    "lib64/libcudart_static.a": "runtime_static",
    "include/cublas_v2.h": "cublas",
    "lib64/libcublas.so": "cublas",
    "lib64/libcublasLt.so": "cublas",
}
_CCCL_HEADERS = ("include/cccl/cub/cub.cuh", "include/cub/cub.cuh")
COMPONENT_WHEELS: dict[int, dict[str, str | None]] = {
    13: {
        "nvcc": "nvidia-cuda-nvcc", "nvvm": "nvidia-nvvm", "crt": "nvidia-cuda-crt",
        "runtime": "nvidia-cuda-runtime", "runtime_static": "nvidia-cuda-runtime",
        "cublas": "nvidia-cublas", "cccl": "nvidia-cuda-cccl",
    },
    12: {
        "nvcc": None, "nvvm": None, "crt": None, "runtime": "nvidia-cuda-runtime-cu12",
        "runtime_static": None, "cublas": "nvidia-cublas-cu12", "cccl": "nvidia-cuda-cccl-cu12",
    },
}

# Windows: the same components, NVIDIA's Windows toolkit layout (see the module docstring).
WINDOWS_REQUIRED_FILES: dict[str, str] = {
    "bin/nvcc.exe": "nvcc",
    "bin/nvcc.profile": "nvcc",
    "bin/ptxas.exe": "nvcc",
    "bin/fatbinary.exe": "nvcc",
    "bin/nvlink.exe": "nvcc",
    "bin/cudafe++.exe": "nvcc",
    "nvvm/bin/cicc.exe": "nvvm",
    "nvvm/libdevice/libdevice.10.bc": "nvvm",
    "include/crt/host_config.h": "crt",
    "include/cuda_runtime.h": "runtime",
    "lib/x64/cudart.lib": "runtime",
    "lib/x64/cudart_static.lib": "runtime_static",  # CMake's compiler check links the static runtime
    "include/cublas_v2.h": "cublas",
    "lib/x64/cublas.lib": "cublas",
    "lib/x64/cublasLt.lib": "cublas",
    "lib/x64/cuda.lib": "driver",
}
# Import libraries written from a DLL when no component has them: farm name -> DLL name pattern.
WINDOWS_IMPORT_LIBS: dict[str, str] = {"cublas.lib": "cublas64_*.dll", "cublasLt.lib": "cublasLt64_*.dll"}


@dataclass(frozen=True)
class Layout:
    """Where a toolkit root keeps what: Linux's ``bin/nvcc`` and ``lib64/``, Windows' ``bin\\nvcc.exe``
    and ``lib\\x64\\``; and how the root is made (a symlink farm, or hard links and copies)."""

    name: str
    exe: str  # suffix of programs
    lib_dir: str
    top_dirs: dict[str, str]  # a component's top-level directory -> where it lands in the root
    required: dict[str, str]  # root path -> component
    libraries: dict[str, str]  # CMake's CUDA_<name>_LIBRARY -> file in lib_dir
    driver_library: str  # root path of the driver's link library
    symlinks: bool

    def nvcc(self, root: Path) -> Path:
        return root / "bin" / f"nvcc{self.exe}"


LINUX = Layout(
    name="linux", exe="", lib_dir="lib64", top_dirs=_TOP_DIRS, required=REQUIRED_FILES,
    libraries={"cudart": "libcudart.so", "cublas": "libcublas.so", "cublasLt": "libcublasLt.so"},
    driver_library="lib64/stubs/libcuda.so", symlinks=True,
)
WINDOWS = Layout(
    name="windows", exe=".exe", lib_dir="lib/x64",
    top_dirs={"bin": "bin", "include": "include", "lib": "lib", "nvvm": "nvvm"},
    required=WINDOWS_REQUIRED_FILES,
    libraries={"cudart": "cudart.lib", "cublas": "cublas.lib", "cublasLt": "cublasLt.lib"},
    driver_library="lib/x64/cuda.lib", symlinks=False,
)
LAYOUTS = {layout.name: layout for layout in (LINUX, WINDOWS)}


def host_layout() -> Layout:
    """The layout of a toolkit for this machine's builds (a Windows host builds with MSVC and nvcc.exe)."""
    return WINDOWS if os.name == "nt" else LINUX


@dataclass(frozen=True)
class CudaToolkit:
    """A verified CUDA toolkit root, ready for CMake."""

    spec: CudaSpec
    root: Path
    nvcc_version: str  # e.g. "13.0.88"
    nvcc_banner: str  # nvcc --version's "Cuda compilation tools, release 13.0, V13.0.88"
    wheels: dict[str, str] = field(default_factory=dict)  # installed wheel name -> version
    stub_generated: bool = False
    layout: str = "linux"
    generated: tuple[str, ...] = ()  # import libraries written here: "cublas.lib<cublas64_13.dll"

    @property
    def _layout(self) -> Layout:
        return LAYOUTS[self.layout]

    @property
    def nvcc(self) -> Path:
        return self._layout.nvcc(self.root)

    @property
    def lib_dir(self) -> Path:
        return self.root / self._layout.lib_dir

    @property
    def include_dir(self) -> Path:
        return self.root / "include"

    @property
    def driver_library(self) -> Path:
        return self.root / self._layout.driver_library

    @property
    def versions(self) -> dict[str, str]:
        """Toolchain versions for the content key and the manifest (no paths)."""
        out = {"nvcc": self.nvcc_banner, "cuda_toolkit": self.spec.toolkit}
        out.update({f"cuda_wheel:{name}": version for name, version in sorted(self.wheels.items())})
        if self.layout != LINUX.name:  # Linux keys stay what they were before there was a choice
            out["cuda_layout"] = self.layout
            out["cuda_import_libs"] = ",".join(sorted(self.generated)) or "none written"
            out["cuda_driver_lib"] = f"written for {cuda_stub.DRIVER_DLL}" if self.stub_generated else "toolkit's"
        return out

    def cmake_defines(self) -> dict[str, str]:
        """Path-valued CMake definitions (outside the key: the key has ``versions``)."""
        layout = self._layout
        # CMake takes forward slashes on Windows too, and a backslash in a -D value can turn into an
        # escape in the files it generates.
        path = str if layout.symlinks else (lambda p: p.as_posix())
        d = {"CMAKE_CUDA_COMPILER": path(self.nvcc), "CUDAToolkit_ROOT": path(self.root)}
        d.update({f"CUDA_{name}_LIBRARY": path(self.lib_dir / file) for name, file in layout.libraries.items()})
        if layout is LINUX:
            # The wheels' nvcc.profile looks for headers under targets/<arch>-linux/include, which the
            # farm does not have; Windows' profile reads $(TOP)/include, the root's own.
            d["CMAKE_CUDA_FLAGS"] = f"-isystem {self.include_dir}"
        if not self.spec.no_vmm:
            d["CUDA_cuda_driver_LIBRARY"] = path(self.driver_library)
        return d

    def env(self) -> dict[str, str]:
        """Environment for configure and build: nvcc first on PATH, CUDA_HOME at the farm."""
        path = os.environ.get("PATH", "")
        return {
            "PATH": f"{self.root / 'bin'}{os.pathsep}{path}" if path else str(self.root / "bin"),
            "CUDA_HOME": str(self.root),
            "CUDA_PATH": str(self.root),
        }

    def to_json(self) -> dict[str, object]:
        return {
            "spec": self.spec.to_json(),
            "nvcc_version": self.nvcc_version,
            "nvcc_banner": self.nvcc_banner,
            "wheels": dict(sorted(self.wheels.items())),
            "stub_generated": self.stub_generated,
            "assembly": ASSEMBLY_VERSION,
            "layout": self.layout,
            "generated": list(self.generated),
        }


def cuda_cache_dir() -> Path:
    return cache_root() / "cuda"


def split_pin(pin: str) -> tuple[str, str]:
    m = _PIN_SPLIT.match(pin)
    if not m:
        raise NativeBuildError(f"{pin!r} is not an exact pin 'name==version'")
    return m.group(1), m.group(2)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def kit_hash(spec: CudaSpec, system_root: Path | None = None, layout: Layout = LINUX) -> str:
    """The cache key of a toolkit: its pins and layout, and for a system toolkit which nvcc it is."""
    inputs: dict[str, object] = {
        "assembly": ASSEMBLY_VERSION,
        "toolkit": spec.toolkit,
        "packages": sorted(_canonical(split_pin(p)[0]) + "==" + split_pin(p)[1] for p in spec.packages),
        "machine": platform.machine(),
    }
    if layout is not LINUX:  # absent for Linux: its cached toolkits keep their directories
        inputs["layout"] = layout.name
    if system_root is not None:
        nvcc = layout.nvcc(system_root)
        st = nvcc.stat()
        inputs["system"] = {"root": str(system_root), "nvcc_size": st.st_size, "nvcc_mtime_ns": st.st_mtime_ns}
    return sha256_json(inputs)[:16]


# ---------------------------------------------------------------------------- installation

def pip_install(pins: Sequence[str], target: Path) -> None:
    """Install exactly ``pins`` (binary wheels, no dependency resolution) into ``target``."""
    log.info("installing the CUDA toolkit wheels %s (several hundred MB, once)", " ".join(pins))
    done = proc.run(pip.install_target(pins, target), check=False)
    if done.returncode != 0:
        raise NativeBuildError(
            f"pip could not install the CUDA toolkit wheels {' '.join(pins)}:\n{proc.tail(done)}\n"
            "Check that each pin exists for this platform (`pip download --no-deps NAME==VERSION`) "
            "and fix [config.cuda].packages in manifests/configs.toml."
        )


def installed_wheels(site: Path) -> dict[str, str]:
    """Canonical name -> version of every distribution installed in ``site``."""
    out: dict[str, str] = {}
    for meta in sorted(site.glob("*.dist-info/METADATA")):
        name = version = None
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Name:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("Version:"):
                version = line.split(":", 1)[1].strip()
            elif not line.strip():
                break
        if name and version:
            out[_canonical(name)] = version
    return out


def _check_pins_installed(pins: Sequence[str], installed: dict[str, str]) -> None:
    for pin in pins:
        name, version = split_pin(pin)
        got = installed.get(_canonical(name))
        if got != version:
            raise NativeBuildError(
                f"the toolkit install has {name} {got or 'missing'}, but the configuration pins {version}"
            )


# ---------------------------------------------------------------------------- layout

def find_components(site: Path) -> list[Path]:
    """Toolkit component roots in a pip target: ``nvidia/cu13`` (CUDA 13) and ``nvidia/<lib>`` (CUDA 12)."""
    nvidia = site / "nvidia"
    if not nvidia.is_dir():
        return []
    out = []
    for entry in sorted(nvidia.iterdir()):
        if entry.is_dir() and any((entry / d).is_dir() for d in _TOP_DIRS):
            out.append(entry)
    # cu13 first: it is one complete tree; the per-library CUDA 12 dirs merge in after it.
    out.sort(key=lambda p: (p.name != "cu13", p.name))
    return out


def _link(src: Path, dst: Path, base: Path) -> None:
    """Symlink ``dst`` -> ``src``, relative when both lie under ``base`` (the farm survives a rename)."""
    try:
        src.relative_to(base)
        target = os.path.relpath(src, dst.parent)
    except ValueError:
        target = str(src)
    os.symlink(target, dst)


def _place(src: Path, dst: Path) -> None:
    """Hard-link ``dst`` to ``src`` (no privilege needed on Windows, unlike a symlink), else copy it."""
    try:
        os.link(src, dst)
    except OSError:  # another volume (a system toolkit on D:, the cache on C:), or no hard links there
        shutil.copy2(src, dst)


def _merge_dir(src: Path, dst: Path, base: Path, seen: set[str], layout: Layout = LINUX) -> None:
    real = os.path.realpath(src)
    if real in seen:  # a directory reached twice (lib64 -> lib) or a symlink loop
        return
    seen.add(real)
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        if entry.name in _SKIP_NAMES or entry.name.endswith(".dist-info"):
            continue
        out = dst / entry.name
        if entry.is_dir():
            if out.is_symlink():
                raise NativeBuildError(f"toolkit layout conflict: {entry} is a directory, {out} a file")
            _merge_dir(entry, out, base, seen, layout)
        elif entry.is_file():
            if not layout.symlinks and entry.suffix.lower() == ".dll":
                continue  # nothing loads a DLL at build time (see the module docstring)
            if out.is_symlink() or out.exists():
                if os.path.realpath(out) != os.path.realpath(entry):
                    log.debug("toolkit farm: keeping %s, ignoring %s", os.path.realpath(out), entry)
                continue
            if layout.symlinks:
                _link(entry, out, base)
            else:
                _place(entry, out)


def assemble(components: Sequence[Path], root: Path, base: Path | None = None, layout: Layout = LINUX) -> None:
    """Merge toolkit components into ``root``: on Linux a symlink farm (bin/ include/ lib64/ nvvm/,
    lib -> lib64), on Windows hard links or copies (bin\\ include\\ lib\\x64\\ nvvm\\, no DLLs)."""
    base = base or root.parent
    for sub in ("bin", "include", layout.lib_dir, "nvvm"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    if layout.symlinks and not (root / "lib").exists():
        os.symlink("lib64", root / "lib")
    seen: set[str] = set()
    for comp in components:
        for name, to in layout.top_dirs.items():
            if (comp / name).is_dir():
                _merge_dir(comp / name, root / to, base, seen, layout)
        seen.clear()  # loops are per component; the same dir may serve two farm dirs only once each
    if layout is LINUX:
        make_link_names(root / "lib64")


def make_link_names(lib_dir: Path) -> list[str]:
    """Create the unversioned development names (``libcublas.so -> libcublas.so.13``) CMake links with."""
    made = []
    versioned: dict[str, list[str]] = {}
    for entry in sorted(lib_dir.iterdir()):
        m = _UNVERSIONED.match(entry.name)
        if m:
            versioned.setdefault(m.group(1), []).append(entry.name)
    for plain, names in sorted(versioned.items()):
        link = lib_dir / plain
        if link.exists() or link.is_symlink():
            continue
        # The shortest versioned name is the SONAME (libcudart.so.13, not libcudart.so.13.0.96).
        os.symlink(min(names, key=lambda n: (len(n), n)), link)
        made.append(plain)
    return made


def ensure_driver_stub(root: Path, layout: Layout = LINUX) -> bool:
    """Provide the driver's link library: the toolkit's own if it has one, else a generated one
    (``lib64/stubs/libcuda.so``; on Windows ``lib/x64/cuda.lib`` for ``nvcuda.dll``)."""
    if layout is WINDOWS:
        lib = root / layout.driver_library
        if lib.exists():
            return False
        cuda_stub.driver_import_library(lib)
        return True
    stubs = root / "lib64" / "stubs"
    if (stubs / "libcuda.so").exists():
        return False
    if (stubs / "libcuda.so").is_symlink():  # a dangling link from a broken system toolkit
        (stubs / "libcuda.so").unlink()
    cuda_stub.generate(stubs)
    return True


def ensure_import_libs(root: Path, components: Sequence[Path], layout: Layout = LINUX) -> list[str]:
    """Write the import libraries a Windows root lacks (cuBLAS's) from the first component DLL that
    exports them; returns ``"<lib><<dll>"`` for each one written (none on Linux)."""
    if layout is not WINDOWS:
        return []
    written = []
    for lib in sorted(WINDOWS_IMPORT_LIBS):
        out = root / layout.lib_dir / lib
        dll = None if out.exists() else import_lib_source(lib, components)
        if dll is not None:  # None: present, or reported by missing_files with the wheel to add
            cuda_stub.dll_import_library(out, dll)
            written.append(f"{lib}<{dll.name}")
    return written


def import_lib_source(lib: str, components: Sequence[Path]) -> Path | None:
    """The DLL the import library ``lib`` is written from: the first component's (pinned wheels first)."""
    return next((d for comp in components if (comp / "bin").is_dir()
                 for d in sorted((comp / "bin").rglob(WINDOWS_IMPORT_LIBS[lib])) if d.is_file()), None)


def missing_files(root: Path, layout: Layout = LINUX) -> list[tuple[str, str]]:
    """(farm path, component) for every required file the farm lacks."""
    out = [(rel, comp) for rel, comp in layout.required.items() if not (root / rel).exists()]
    if not any((root / rel).exists() for rel in _CCCL_HEADERS):
        out.append((_CCCL_HEADERS[0], "cccl"))
    return out


_NO_WHEEL = {
    "linux": "nvidia-cuda-nvcc-cu12 ships only ptxas and libnvvm",
    "windows": "nvidia-cuda-nvcc-cu12's win_amd64 wheel ships only ptxas.exe and nvvm64_40_0.dll, and the "
               "CUDA 12 runtime and cuBLAS wheels no .lib",
}


def _missing_message(spec: CudaSpec, missing: list[tuple[str, str]], pins: Sequence[str],
                     layout: Layout = LINUX) -> str:
    wheels = COMPONENT_WHEELS.get(spec.major, {})
    pinned = {_canonical(split_pin(p)[0]): split_pin(p)[1] for p in pins}
    nvcc_pin = pinned.get("nvidia-cuda-nvcc")
    where = "" if layout is LINUX else f" for {layout.name}"
    lines = [f"the CUDA {spec.version} toolkit{where} is incomplete:"]
    for rel, comp in missing:
        wheel = wheels.get("runtime" if comp == "driver" else comp)
        dll = WINDOWS_IMPORT_LIBS.get(Path(rel).name) if layout is WINDOWS else None
        needs = f"{dll}, which the import library is written from" if dll else "the file"
        if wheel is None:
            hint = (f"no PyPI wheel provides it for this CUDA line ({_NO_WHEEL[layout.name]}): use "
                    "toolkit = \"system\" with CUDA_HOME at a full CUDA toolkit")
        elif wheel in pinned:
            hint = (f"add {wheel}=={pinned[wheel]} to [config.cuda].packages (it is pinned, but its wheel "
                    f"for this platform lacks {needs}: pin a release whose wheel has it)")
        else:
            suffix = f"=={nvcc_pin}" if nvcc_pin and comp in ("nvvm", "crt") else "==<version>"
            hint = f"add {wheel}{suffix} to [config.cuda].packages" + (f" (for {dll})" if dll else "")
        lines.append(f"  {rel} ({comp}): {hint}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- verification

def nvcc_version(nvcc: Path) -> tuple[str, str, str]:
    """(banner line, release 'X.Y', full version 'X.Y.Z') from ``nvcc --version``."""
    try:
        done = proc.run([nvcc, "--version"], check=False, timeout=60)
    except (OSError, ToolNotFoundError, ToolTimeoutError) as exc:
        raise NativeBuildError(f"`{nvcc} --version` could not run: {exc}") from None
    text = done.stdout + done.stderr
    m = _RELEASE.search(text)
    if done.returncode != 0 or not m:
        raise NativeBuildError(f"`{nvcc} --version` failed (exit {done.returncode}):\n{text.strip()[-1500:]}")
    banner = next(line.strip() for line in text.splitlines() if "release" in line)
    return banner, m.group(1), m.group(2)


_PROBE = """#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>
__global__ void probe(half *x) { x[threadIdx.x] = __float2half(1.0f); }
"""


def compile_probe(nvcc: Path, env: dict[str, str], arch: str = "80") -> None:
    """Compile one kernel that includes cudart, fp16 and cuBLAS headers: cicc, ptxas and fatbinary all run."""
    with tempfile.TemporaryDirectory(prefix="nvcc-probe-") as tmp:
        src = Path(tmp) / "probe.cu"
        src.write_text(_PROBE, encoding="utf-8")
        cmd = [str(nvcc), "-c", str(src), "-o", str(Path(tmp) / "probe.o"),
               f"-gencode=arch=compute_{arch},code=sm_{arch}"]
        done = proc.run(cmd, check=False, env={**os.environ, **env}, timeout=300)
        if done.returncode != 0:
            raise NativeBuildError(
                f"the provisioned nvcc cannot compile a probe kernel (`{' '.join(cmd)}`):\n{proc.tail(done)}"
            )


# ---------------------------------------------------------------------------- provisioning

DEFAULT_SYSTEM_ROOTS = ("/usr/local/cuda",)


def system_root(environ: dict[str, str] | None = None, defaults: Sequence[str] = DEFAULT_SYSTEM_ROOTS,
                layout: Layout = LINUX) -> Path:
    """The system toolkit: ``$CUDA_HOME``, ``$CUDA_PATH``, ``/usr/local/cuda``, else nvcc's parent on PATH."""
    environ = dict(os.environ) if environ is None else environ
    candidates = [environ.get("CUDA_HOME"), environ.get("CUDA_PATH"), *defaults]
    for c in candidates:
        if c and layout.nvcc(Path(c)).is_file():
            return Path(c).resolve()
    which = shutil.which(f"nvcc{layout.exe}", path=environ.get("PATH"))
    if which:
        return Path(which).resolve().parent.parent
    raise NativeBuildError(
        "toolkit = \"system\" but no CUDA toolkit was found (looked at $CUDA_HOME, $CUDA_PATH, "
        "/usr/local/cuda and nvcc on PATH): install the CUDA toolkit or set CUDA_HOME to its root"
    )


def _load_stamp(final: Path, spec: CudaSpec, layout: Layout = LINUX) -> CudaToolkit | None:
    stamp = final / STAMP
    if not stamp.is_file():
        return None
    try:
        data = json.loads(stamp.read_text(encoding="utf-8"))
        kit = CudaToolkit(
            spec=spec, root=final / "toolkit", nvcc_version=data["nvcc_version"],
            nvcc_banner=data["nvcc_banner"], wheels=dict(data["wheels"]),
            stub_generated=bool(data["stub_generated"]), layout=str(data.get("layout", LINUX.name)),
            generated=tuple(data.get("generated", ())),
        )
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the damaged CUDA toolkit cache %s: %s", final, exc)
        return None
    if kit.layout != layout.name or not kit.nvcc.exists() or missing_files(kit.root, layout):
        log.warning("ignoring the incomplete CUDA toolkit cache %s", final)
        return None
    return kit


def provision(spec: CudaSpec, *, installer: Installer | None = None, verify: bool = True,
              environ: dict[str, str] | None = None, layout: Layout | None = None) -> CudaToolkit:
    """Return the toolkit for ``spec``, installing and assembling it once (cached, atomic).

    ``layout``: the host's (:func:`host_layout`) unless given; a Windows layout is assembled the
    same way on any host, which is how it is tested on Linux.
    """
    installer = installer or pip_install
    layout = layout or host_layout()
    sys_root = system_root(environ, layout=layout) if spec.toolkit == "system" else None
    final = cuda_cache_dir() / kit_hash(spec, sys_root, layout)
    with exclusive(final.with_name(final.name + ".lock")):
        kit = _load_stamp(final, spec, layout)
        if kit is not None:
            _check_release(spec, kit.nvcc_version, kit.root)
            return kit
        for stale in final.parent.glob(f".{final.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        with staging_dir(final) as stage:
            kit = _build(spec, stage, final, installer, sys_root, verify, layout)
            write_json_atomic(stage / STAMP, kit.to_json())  # last: marks the toolkit finished
        log.info("CUDA toolkit %s ready at %s", kit.nvcc_version, final / "toolkit")
        return CudaToolkit(spec, final / "toolkit", kit.nvcc_version, kit.nvcc_banner, kit.wheels,
                           kit.stub_generated, kit.layout, kit.generated)


def _build(spec: CudaSpec, stage: Path, final: Path, installer: Installer, sys_root: Path | None,
           verify: bool, layout: Layout = LINUX) -> CudaToolkit:
    site = stage / "site"
    site.mkdir()
    wheels: dict[str, str] = {}
    if spec.packages:
        installer(list(spec.packages), site)
        installed = installed_wheels(site)
        _check_pins_installed(spec.packages, installed)
        wheels = {_canonical(split_pin(p)[0]): split_pin(p)[1] for p in spec.packages}
    # Pinned wheels first: what they provide is what the manifest says was linked; a system
    # toolkit fills the rest (nvcc, cicc, crt headers, the static runtime).
    components = find_components(site) + ([sys_root] if sys_root is not None else [])
    if not components:
        raise NativeBuildError(f"the toolkit wheels {list(spec.packages)} installed no nvidia/ tree in {site}")
    root = stage / "toolkit"
    assemble(components, root, base=stage, layout=layout)
    # An incomplete set is refused before anything is written, naming all it lacks but what can be
    # written here: the driver's link library, and import libraries whose DLL is at hand.
    missing = [(rel, comp) for rel, comp in missing_files(root, layout)
               if comp != "driver" and not _writable_import_lib(rel, components, layout)]
    if missing:
        raise NativeBuildError(_missing_message(spec, missing, spec.packages, layout))
    generated = tuple(ensure_import_libs(root, components, layout))
    stub = ensure_driver_stub(root, layout)
    missing = missing_files(root, layout)
    if missing:
        raise NativeBuildError(_missing_message(spec, missing, spec.packages, layout))
    banner, _release, full = nvcc_version(layout.nvcc(root))
    _check_release(spec, full, root)
    kit = CudaToolkit(spec, root, full, banner, wheels, stub, layout.name, generated)
    if verify:
        compile_probe(kit.nvcc, kit.env())
    return kit


def _writable_import_lib(rel: str, components: Sequence[Path], layout: Layout) -> bool:
    name = Path(rel).name
    return layout is WINDOWS and name in WINDOWS_IMPORT_LIBS and import_lib_source(name, components) is not None


def _check_release(spec: CudaSpec, full_version: str, root: Path) -> None:
    release = ".".join(full_version.split(".")[:2])
    if release != spec.version:
        where = "CUDA_HOME" if spec.toolkit == "system" else "[config.cuda].packages"
        raise NativeBuildError(
            f"the toolkit at {root} is CUDA {full_version}, but the configuration asks for CUDA "
            f"{spec.version}: fix {where} or [config.cuda].version"
        )

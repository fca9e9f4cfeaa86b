"""The Windows CUDA toolkit root (cuda_toolkit.WINDOWS), assembled here on Linux.

The wheels are synthetic trees with the file lists NVIDIA's win_amd64 wheels really have (read
from PyPI at the pins of manifests/configs.toml); their cuBLAS DLLs are real DLLs built with
MinGW-w64, so the import libraries written from their export tables are linked against and the
program's import table is read back. nvcc.exe is a shell script printing nvcc's banner. One test
assembles the real wheels when they are in the download cache, and skips naming the command
that fetches them otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from build_tools.common.compilers import Toolchain
from build_tools.common.hashing import sha256_json
from build_tools.common.paths import cache_root
from build_tools.common.pe import is_system_dll, read_pe
from build_tools.errors import NativeBuildError
from build_tools.inputs.configs import load_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages.native import build as native
from build_tools.stages.native import cuda_stub, cuda_toolkit
from build_tools.stages.vendor import VendoredTree

pytestmark = pytest.mark.windows

MINGW = shutil.which("x86_64-w64-mingw32-gcc")
DLLTOOL = next((t for t in ("llvm-dlltool", *(f"llvm-dlltool-{v}" for v in range(22, 13, -1))) if shutil.which(t)), None)
needs_mingw = pytest.mark.skipif(MINGW is None or DLLTOOL is None,
                                 reason="needs MinGW-w64 (x86_64-w64-mingw32-gcc) and llvm-dlltool")

# What the win_amd64 wheels hold, less most headers (one per directory the checks look at).
CU13_FILES: dict[str, tuple[str, ...]] = {
    "nvidia-cuda-nvcc==13.0.88": (
        "bin/__nvcc_device_query.exe", "bin/bin2c.exe", "bin/cudafe++.exe", "bin/fatbinary.exe",
        "bin/nvcc.exe", "bin/nvcc.profile", "bin/nvlink.exe", "bin/ptxas.exe", "bin/crt/link.stub",
        "bin/crt/prelink.stub", "include/fatbinary_section.h"),
    "nvidia-nvvm==13.0.88": (
        "bin/x86_64/nvvm64_40_0.dll", "nvvm/bin/cicc.exe", "nvvm/libdevice/libdevice.10.bc", "include/nvvm.h"),
    "nvidia-cuda-crt==13.0.88": ("include/crt/host_config.h", "include/crt/common_functions.h"),
    "nvidia-cuda-runtime==13.0.96": (
        "bin/x86_64/cudart64_13.dll", "lib/x64/cuda.lib", "lib/x64/cudadevrt.lib", "lib/x64/cudart.lib",
        "lib/x64/cudart_static.lib", "include/cuda.h", "include/cuda_runtime.h", "include/cuda_fp16.h"),
    "nvidia-cublas==13.0.2.14": (
        "bin/x86_64/cublas64_13.dll", "bin/x86_64/cublasLt64_13.dll", "bin/x86_64/nvblas64_13.dll",
        "include/cublas.h", "include/cublasLt.h", "include/cublas_api.h", "include/cublas_v2.h"),
    "nvidia-cuda-cccl==13.0.85": (
        "include/cccl/cub/cub.cuh", "include/cccl/thrust/version.h", "lib/cmake/cccl/cccl-config.cmake",
        ".metadata/provenance.txt"),
}
CU12_FILES: dict[str, tuple[str, ...]] = {
    "nvidia-cuda-nvcc-cu12==12.8.93": (
        "cuda_nvcc/bin/ptxas.exe", "cuda_nvcc/nvvm/bin/nvvm64_40_0.dll", "cuda_nvcc/nvvm/libdevice/libdevice.10.bc",
        "cuda_nvcc/include/__init__.py", "cuda_nvcc/include/crt/host_config.h"),
    "nvidia-cuda-runtime-cu12==12.8.90": (
        "cuda_runtime/bin/cudart64_12.dll", "cuda_runtime/include/__init__.py", "cuda_runtime/include/cuda_runtime.h"),
    "nvidia-cublas-cu12==12.8.4.1": (
        "cublas/bin/__init__.py", "cublas/bin/cublas64_12.dll", "cublas/bin/cublasLt64_12.dll",
        "cublas/include/cublas_v2.h"),
    "nvidia-cuda-cccl-cu12==12.8.90": ("cuda_cccl/include/cub/cub.cuh", "cuda_cccl/lib/cmake/cccl/cccl-config.cmake"),
}
# What the exports of the fake cuBLAS DLLs are (the real ones export about a thousand names).
EXPORTS = {"cublas": ("cublasCreate_v2", "cublasGemmEx", "cublasSgemm_v2"), "cublasLt": ("cublasLtCreate",)}
DOWNLOADS = cache_root() / "downloads" / "cuda-windows"


@pytest.fixture(scope="module")
def dlls(tmp_path_factory) -> dict[str, Path]:
    """Real DLLs named as NVIDIA's (their export directory carries the name), from MinGW-w64."""
    if MINGW is None:
        return {}
    out = tmp_path_factory.mktemp("dlls")
    made = {}
    for major in (12, 13):
        for stem, names in EXPORTS.items():
            name = f"{stem}64_{major}.dll"
            src = out / f"{stem}{major}.c"
            src.write_text("".join(f"__declspec(dllexport) int {n}(void) {{ return {i}; }}\n"
                                   for i, n in enumerate(names)))
            subprocess.run([MINGW, "-shared", "-o", str(out / name), str(src)], check=True)
            made[name] = out / name
    return made


def _nvcc_script(version: str) -> str:
    release = ".".join(version.split(".")[:2])
    return textwrap.dedent(f"""\
        #!/bin/sh
        echo "nvcc: NVIDIA (R) Cuda compiler driver"
        echo "Cuda compilation tools, release {release}, V{version}"
        """)


def _write(path: Path, dlls: dict[str, Path], nvcc_version: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name == "nvcc.exe":
        path.write_text(_nvcc_script(nvcc_version))
        path.chmod(0o755)
    elif path.name in dlls:
        shutil.copy(dlls[path.name], path)
    elif path.suffix in (".exe", ".dll"):
        path.write_bytes(b"MZ" + path.name.encode())  # never run nor read: only its presence counts
    else:
        path.write_text(f"{path.name} from the wheel")


class Wheels:
    """Stands in for ``pip install --target``: the wheels' files (less ``drop``) and dist-info."""

    def __init__(self, files: dict[str, tuple[str, ...]], dlls: dict[str, Path], *, top: str = "nvidia/cu13",
                 drop: tuple[str, ...] = ()) -> None:
        self.files, self.dlls, self.top, self.drop, self.calls = files, dlls, top, drop, 0

    def __call__(self, pins, target: Path) -> None:
        self.calls += 1
        nvcc = next((p.split("==")[1] for p in pins if p.startswith("nvidia-cuda-nvcc")), "13.0.88")
        for pin in pins:
            name, version = pin.split("==")
            info = target / f"{name.replace('-', '_')}-{version}.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
            for rel in self.files.get(pin, ()):
                if rel not in self.drop:
                    _write(target / self.top / rel, self.dlls, nvcc)


def _cu13_spec():
    return load_matrix().get("cuda-13.0-windows").cuda


def _link(tmp: Path, lib: Path, symbol: str) -> tuple[str, ...]:
    """The non-system DLLs a program calling ``symbol`` imports when linked against the import library ``lib``."""
    src = tmp / f"call_{symbol}.c"
    src.write_text(f"int {symbol}(void);\nint main(void) {{ return {symbol}(); }}\n")
    exe = tmp / f"call_{symbol}.exe"
    subprocess.run([MINGW, str(src), str(lib), "-o", str(exe)], check=True)
    return tuple(n.lower() for n in read_pe(exe).needed if not is_system_dll(n))


# ---------------------------------------------------------------------------- the CUDA 13 wheels

@needs_mingw
def test_cuda13_wheels_make_a_windows_root(empty_cache, dlls, tmp_path):
    wheels = Wheels(CU13_FILES, dlls)
    kit = cuda_toolkit.provision(_cu13_spec(), installer=wheels, verify=False, layout=cuda_toolkit.WINDOWS)
    root, site = kit.root, kit.root.parent / "site" / "nvidia" / "cu13"
    assert root == empty_cache / "cuda" / cuda_toolkit.kit_hash(_cu13_spec(), layout=cuda_toolkit.WINDOWS) / "toolkit"
    assert cuda_toolkit.missing_files(root, cuda_toolkit.WINDOWS) == []
    assert (root / "include/cccl/cub/cub.cuh").is_file() and (root / "bin/crt/link.stub").is_file()
    # No symlinks (they need a privilege on Windows), no DLLs, nothing of the wheels' packaging.
    every = list(root.rglob("*"))
    assert not [p for p in every if p.is_symlink()]
    assert not [p for p in every if p.suffix == ".dll"] and not (root / ".metadata").exists()
    # Hard links into the pip target: nvcc.exe started from the root's bin\ sees the root as TOP.
    for rel in ("bin/nvcc.exe", "bin/nvcc.profile", "nvvm/bin/cicc.exe", "lib/x64/cudart.lib"):
        assert (root / rel).stat().st_ino == (site / rel).stat().st_ino, rel
    # cuda.lib is the runtime wheel's; cuBLAS's import libraries were written from its DLLs.
    assert not kit.stub_generated and (root / "lib/x64/cuda.lib").read_text() == "cuda.lib from the wheel"
    assert kit.generated == ("cublas.lib<cublas64_13.dll", "cublasLt.lib<cublasLt64_13.dll")
    assert _link(tmp_path, root / "lib/x64/cublas.lib", "cublasGemmEx") == ("cublas64_13.dll",)
    assert _link(tmp_path, root / "lib/x64/cublasLt.lib", "cublasLtCreate") == ("cublaslt64_13.dll",)

    d = kit.cmake_defines()
    assert d["CMAKE_CUDA_COMPILER"] == (root / "bin/nvcc.exe").as_posix() and "\\" not in "".join(d.values())
    assert d["CUDA_cublas_LIBRARY"].endswith("/lib/x64/cublas.lib")
    assert d["CUDA_cuda_driver_LIBRARY"].endswith("/lib/x64/cuda.lib")
    assert "CMAKE_CUDA_FLAGS" not in d  # the Windows nvcc.profile already reads $(TOP)/include
    assert all(Path(v).exists() for v in d.values())
    assert kit.env()["CUDA_PATH"] == str(root)

    v = kit.versions
    assert v["nvcc"] == "Cuda compilation tools, release 13.0, V13.0.88" and v["cuda_layout"] == "windows"
    assert v["cuda_import_libs"] == "cublas.lib<cublas64_13.dll,cublasLt.lib<cublasLt64_13.dll"
    assert v["cuda_driver_lib"] == "toolkit's"
    assert v["cuda_wheel:nvidia-cublas"] == "13.0.2.14" and not any(str(empty_cache) in x for x in v.values())
    stamp = json.loads((root.parent / "toolkit.json").read_text())
    assert stamp["layout"] == "windows" and stamp["generated"] == list(kit.generated)
    # A second call is a cache hit: nothing installed or written again, the same versions.
    again = cuda_toolkit.provision(_cu13_spec(), installer=wheels, verify=False, layout=cuda_toolkit.WINDOWS)
    assert wheels.calls == 1 and again.versions == v and again.root == root
    assert not list((empty_cache / "cuda").glob(".*.tmp-*"))


@needs_mingw
def test_a_missing_cuda_lib_is_written_for_nvcuda(empty_cache, dlls, tmp_path):
    wheels = Wheels(CU13_FILES, dlls, drop=("lib/x64/cuda.lib",))
    kit = cuda_toolkit.provision(_cu13_spec(), installer=wheels, verify=False, layout=cuda_toolkit.WINDOWS)
    assert kit.stub_generated and kit.driver_library == kit.root / "lib/x64/cuda.lib"
    assert kit.versions["cuda_driver_lib"] == "written for nvcuda.dll"
    assert _link(tmp_path, kit.driver_library, "cuMemCreate") == ("nvcuda.dll",)
    # no_vmm drops the driver link, as on Linux.
    assert "CUDA_cuda_driver_LIBRARY" not in replace(kit, spec=replace(kit.spec, no_vmm=True)).cmake_defines()


@pytest.mark.parametrize(("drop", "named"), [
    (("bin/nvlink.exe",), r"bin/nvlink.exe \(nvcc\): add nvidia-cuda-nvcc==13\.0\.88"),
    (("nvvm/bin/cicc.exe",), r"nvvm/bin/cicc.exe \(nvvm\): add nvidia-nvvm==13\.0\.88"),
    (("lib/x64/cudart_static.lib",), r"lib/x64/cudart_static.lib \(runtime_static\): add nvidia-cuda-runtime==13\.0\.96"),
    (("bin/x86_64/cublas64_13.dll",),
     r"lib/x64/cublas.lib \(cublas\): add nvidia-cublas==13\.0\.2\.14 .* lacks cublas64_\*\.dll, which the import"),
], ids=["nvlink", "cicc", "cudart_static", "cublas-dll"])
def test_an_incomplete_wheel_set_is_refused(empty_cache, drop, named):
    """Refused before any import library is written: no MinGW DLLs or librarian are needed here."""
    wheels = Wheels(CU13_FILES, {}, drop=drop)
    with pytest.raises(NativeBuildError, match=named) as err:
        cuda_toolkit.provision(_cu13_spec(), installer=wheels, verify=False, layout=cuda_toolkit.WINDOWS)
    assert "CUDA 13.0 toolkit for windows is incomplete" in str(err.value)
    assert str(err.value).count("\n  ") == 1  # only what is missing
    assert not list((empty_cache / "cuda").glob("*/toolkit.json")) and not list((empty_cache / "cuda").glob(".*.tmp-*"))


# ---------------------------------------------------------------------------- CUDA 12.8

def test_cuda12_wheels_have_no_windows_compiler(empty_cache):
    spec = replace(load_matrix().get("cuda-12.8-windows").cuda, toolkit="pypi",
                   packages=tuple(CU12_FILES))
    with pytest.raises(NativeBuildError) as err:
        cuda_toolkit.provision(spec, installer=Wheels(CU12_FILES, {}, top="nvidia"), verify=False,
                               layout=cuda_toolkit.WINDOWS)
    msg = str(err.value)
    for rel in ("bin/nvcc.exe", "bin/cudafe++.exe", "nvvm/bin/cicc.exe", "lib/x64/cudart.lib"):
        assert f"  {rel} (" in msg, rel
    assert 'toolkit = "system"' in msg and "ptxas.exe and nvvm64_40_0.dll" in msg


def _archives(root: Path) -> None:
    """NVIDIA's Windows redistributable archives of CUDA 12.8.1 merged into one root (release.yml)."""
    files = ("bin/nvcc.profile", "bin/ptxas.exe", "bin/fatbinary.exe", "bin/nvlink.exe", "bin/cudafe++.exe",
             "bin/cudart64_12.dll", "bin/cublas64_12.dll", "bin/cublasLt64_12.dll", "nvvm/bin/cicc.exe",
             "nvvm/libdevice/libdevice.10.bc", "include/crt/host_config.h", "include/cuda_runtime.h",
             "include/cublas_v2.h", "include/cub/cub.cuh", "lib/x64/cudart.lib", "lib/x64/cudart_static.lib",
             "lib/x64/cuda.lib", "lib/x64/cublas.lib", "lib/x64/cublasLt.lib")
    for rel in files:
        _write(root / rel, {}, "12.8.93")
        if rel.endswith((".lib", ".h")):
            (root / rel).write_text(f"{rel} from the archives")
    _write(root / "bin/nvcc.exe", {}, "12.8.93")


def test_windows_system_toolkit_with_the_cuda12_wheels(empty_cache, tmp_path, monkeypatch):
    """toolkit = "system" on Windows: nvcc.exe and the .lib files from CUDA_HOME (copied when it is on
    another volume), the pinned wheels' headers first; no import library to write."""
    system = tmp_path / "cuda-12.8.1"
    _archives(system)
    real_link = os.link

    def link(src, dst):
        if Path(src).is_relative_to(system):
            raise OSError(18, "Invalid cross-device link")
        real_link(src, dst)

    monkeypatch.setattr(os, "link", link)
    spec = load_matrix().get("cuda-12.8-windows").cuda
    wheels = Wheels({k: v for k, v in CU12_FILES.items() if k in spec.packages}, {}, top="nvidia")
    kit = cuda_toolkit.provision(spec, installer=wheels, verify=False, layout=cuda_toolkit.WINDOWS,
                                 environ={"CUDA_HOME": str(system), "PATH": ""})
    root, site = kit.root, kit.root.parent / "site" / "nvidia"
    lib = root / "lib/x64/cudart.lib"
    assert lib.read_text() == "lib/x64/cudart.lib from the archives"
    assert lib.stat().st_ino != (system / "lib/x64/cudart.lib").stat().st_ino  # a copy
    assert (root / "include/cuda_runtime.h").stat().st_ino == (site / "cuda_runtime/include/cuda_runtime.h").stat().st_ino
    assert (root / "include/cub/cub.cuh").read_text() == "cub.cuh from the wheel"
    assert not list(root.rglob("*.dll")) and not list(root.rglob("__init__.py"))
    assert kit.generated == () and not kit.stub_generated
    v = kit.versions
    assert v["cuda_toolkit"] == "system" and v["cuda_layout"] == "windows" and v["cuda_import_libs"] == "none written"
    assert v["nvcc"].endswith("V12.8.93") and v["cuda_wheel:nvidia-cublas-cu12"] == "12.8.4.1"


def test_system_toolkit_on_windows_is_found_by_nvcc_exe(tmp_path):
    _archives(tmp_path / "cuda")
    found = cuda_toolkit.system_root({"CUDA_PATH": str(tmp_path / "cuda"), "PATH": ""}, defaults=(),
                                     layout=cuda_toolkit.WINDOWS)
    assert found == (tmp_path / "cuda").resolve()
    with pytest.raises(NativeBuildError, match="set CUDA_HOME"):  # a Linux layout has no bin/nvcc there
        cuda_toolkit.system_root({"CUDA_PATH": str(tmp_path / "cuda"), "PATH": ""}, defaults=())


# ---------------------------------------------------------------------------- the content key

def test_the_layout_is_in_the_kit_hash_and_the_build_key(empty_cache, tmp_path, monkeypatch):
    spec = _cu13_spec()
    linux = cuda_toolkit.kit_hash(spec)
    assert cuda_toolkit.kit_hash(spec, layout=cuda_toolkit.WINDOWS) != linux
    # Linux toolkits keep the cache directory they had before there was a Windows layout.
    before = {"assembly": cuda_toolkit.ASSEMBLY_VERSION, "toolkit": spec.toolkit, "machine": os.uname().machine,
              "packages": sorted(spec.packages)}
    assert linux == sha256_json(before)[:16]

    monkeypatch.setattr(cuda_toolkit, "host_layout", lambda: cuda_toolkit.WINDOWS)
    tree = VendoredTree(path=tmp_path, tree_sha256="0" * 64, source="test", commit="c" * 40, build_number=1)
    tc = Toolchain(cmake=Path("cmake"), ninja=Path("ninja"), cc=Path("cl"), cxx=Path("cl"), versions={"cc": "x"})
    config = load_matrix().get("cuda-13.0-windows")
    keys = {}
    for label, cublas, dropped in (("a", "13.0.2.14", ()), ("b", "13.0.0.19", ()),
                                   ("c", "13.0.2.14", ("lib/x64/cuda.lib",))):
        pins = tuple(p if not p.startswith("nvidia-cublas==") else f"nvidia-cublas=={cublas}" for p in spec.packages)
        files = {(k if not k.startswith("nvidia-cublas==") else f"nvidia-cublas=={cublas}"): v for k, v in CU13_FILES.items()}
        shutil.rmtree(empty_cache / "cuda", ignore_errors=True)  # c has a's pins: not its cached toolkit
        monkeypatch.setattr(cuda_toolkit, "pip_install", Wheels(files, {}, drop=dropped))
        monkeypatch.setattr(cuda_toolkit, "ensure_import_libs", _fake_import_libs)
        monkeypatch.setattr(cuda_toolkit, "compile_probe", lambda nvcc, env: None)
        monkeypatch.setattr(cuda_stub, "driver_import_library", lambda out: out.write_bytes(b"!<arch>\n"))
        p = native.plan(replace(config, cuda=replace(config.cuda, packages=pins)), load_lock(), tree, tc)
        keys[label] = p.key
        assert p.toolchain_versions["cuda_layout"] == "windows"
        assert p.key_inputs["toolchain"]["cuda_wheel:nvidia-cublas"] == cublas
        assert p.extra_defines["CMAKE_CUDA_COMPILER"].endswith("/bin/nvcc.exe")
        assert "CMAKE_CUDA_COMPILER" not in p.defines  # paths stay out of the key
    assert len(set(keys.values())) == 3  # a cuBLAS pin, a cuda.lib written here: each another key


def _fake_import_libs(root: Path, components, layout) -> list[str]:
    for lib in cuda_toolkit.WINDOWS_IMPORT_LIBS:
        (root / layout.lib_dir / lib).write_bytes(b"!<arch>\n")
    return sorted(f"{lib}<{lib[:-4]}64_13.dll" for lib in cuda_toolkit.WINDOWS_IMPORT_LIBS)


# ---------------------------------------------------------------------------- import libraries

@needs_mingw
def test_dll_exports_and_def_files(dlls, tmp_path):
    name, exports = cuda_stub.dll_exports(dlls["cublas64_13.dll"])
    assert name == "cublas64_13.dll" and set(exports) == set(EXPORTS["cublas"])
    (tmp_path / "not.dll").write_bytes(b"MZ" + b"\0" * 100)
    with pytest.raises(ValueError, match="no readable PE export table"):
        cuda_stub.dll_exports(tmp_path / "not.dll")
    assert cuda_stub.def_source("nvcuda.dll", ["b", "a", "a"]) == "LIBRARY nvcuda.dll\nEXPORTS\n    a\n    b\n"
    for bad in (["has space"], ["semi;colon"], []):
        with pytest.raises(ValueError):
            cuda_stub.def_source("nvcuda.dll", bad)


def test_no_librarian_names_the_fix(tmp_path):
    with pytest.raises(NativeBuildError, match="vcvars64.*llvm-dlltool"):
        cuda_stub.find_librarian(path=str(tmp_path))


# ---------------------------------------------------------------------------- the real wheels

def _real_wheel(pin: str) -> Path | None:
    name, version = pin.split("==")
    return next(iter(sorted(DOWNLOADS.glob(f"{name.replace('-', '_')}-{version}-*win_amd64.whl"))), None)


def _fetch_command(pins) -> str:
    return (f"pip download --no-deps --platform win_amd64 --only-binary=:all: -d {DOWNLOADS} " + " ".join(pins))


@needs_mingw
def test_the_real_win_amd64_wheels(tmp_path, dlls):
    """The pinned CUDA 13 wheels (cuBLAS's 400 MB wheel is stood in for by its file list) make a
    complete root; the CUDA 12.8 ones lack the compiler."""
    cu13 = [p for p in _cu13_spec().packages if not p.startswith("nvidia-cublas==")]
    cu12 = list(CU12_FILES)
    wanted = cu13 + [p for p in cu12 if not p.startswith("nvidia-cublas-cu12==")]
    if any(_real_wheel(p) is None for p in wanted):
        pytest.skip(f"the win_amd64 CUDA wheels are not downloaded: run `{_fetch_command(wanted)}`")

    def unpack(pins, site: Path) -> None:
        for pin in pins:
            wheel = _real_wheel(pin)
            if wheel is not None:
                with zipfile.ZipFile(wheel) as z:
                    z.extractall(site)
            else:
                Wheels(CU13_FILES | CU12_FILES, dlls, top="nvidia/cu13" if "cu12" not in pin else "nvidia")(
                    [pin], site)

    layout = cuda_toolkit.WINDOWS
    site13 = tmp_path / "site13"
    unpack(_cu13_spec().packages, site13)
    root = tmp_path / "root13"
    comps = cuda_toolkit.find_components(site13)
    assert [c.name for c in comps] == ["cu13"]
    cuda_toolkit.assemble(comps, root, layout=layout)
    assert cuda_toolkit.ensure_import_libs(root, comps, layout) == ["cublas.lib<cublas64_13.dll",
                                                                    "cublasLt.lib<cublasLt64_13.dll"]
    assert not cuda_toolkit.ensure_driver_stub(root, layout)  # the runtime wheel has cuda.lib
    assert cuda_toolkit.missing_files(root, layout) == []
    profile = (root / "bin/nvcc.profile").read_text()
    assert "TOP              = $(_HERE_)/.." in profile and "/LIBPATH:$(TOP)/lib/$(_WIN_PLATFORM_)" in profile
    assert read_pe(root / "bin/nvcc.exe").machine == "x86_64"
    name, exports = cuda_stub.dll_exports(site13 / "nvidia/cu13/bin/x86_64/cudart64_13.dll")
    assert name == "cudart64_13.dll" and "cudaMalloc" in exports and "cudaLaunchKernel" in exports

    site12 = tmp_path / "site12"
    unpack(cu12, site12)
    root12 = tmp_path / "root12"
    comps12 = cuda_toolkit.find_components(site12)
    cuda_toolkit.assemble(comps12, root12, layout=layout)
    missing = {rel for rel, _comp in cuda_toolkit.missing_files(root12, layout)}
    assert {"bin/nvcc.exe", "bin/cudafe++.exe", "bin/nvlink.exe", "bin/fatbinary.exe", "nvvm/bin/cicc.exe",
            "lib/x64/cudart.lib", "lib/x64/cudart_static.lib", "lib/x64/cuda.lib"} <= missing
    assert (root12 / "bin/ptxas.exe").is_file()  # the one compiler piece nvidia-cuda-nvcc-cu12 has

"""CUDA toolkit provisioning, the libcuda link stub and runtime discovery, on fake package trees.

Nothing here downloads a wheel or runs a real nvcc: the "wheels" are directory trees written by a
fake installer with the exact layouts NVIDIA's wheels use (CUDA 13: ``nvidia/cu13/...``; CUDA 12:
``nvidia/<component>/...``), nvcc is a shell script, and the runtime libraries are tiny shared
objects compiled with the C compiler, carrying the real SONAMEs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from build_tools.common.compilers import Toolchain
from build_tools.common.elf import read_dynamic
from build_tools.errors import NativeBuildError
from build_tools.inputs.configs import CudaSpec, load_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages.native import build as native
from build_tools.stages.native import cuda_stub, cuda_toolkit
from build_tools.stages.vendor import VendoredTree
from llama_cpp._native import cuda_runtime as _cuda_runtime

REPO = Path(__file__).resolve().parents[3]
CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None or shutil.which("nm") is None, reason="needs a C compiler and nm")

CU13_PINS = (
    "nvidia-cuda-nvcc==13.0.88", "nvidia-nvvm==13.0.88", "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.96", "nvidia-cublas==13.0.2.14", "nvidia-cuda-cccl==13.0.85",
)
CU12_PINS = ("nvidia-cuda-runtime-cu12==12.8.90", "nvidia-cublas-cu12==12.8.4.1", "nvidia-cuda-cccl-cu12==12.8.90")


# ---------------------------------------------------------------------------- fake trees

def _fake_nvcc(path: Path, full_version: str) -> None:
    """A shell nvcc: prints a real-looking banner, and 'compiles' by creating the -o file."""
    release = ".".join(full_version.split(".")[:2])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "--version" ]; then
          echo "nvcc: NVIDIA (R) Cuda compiler driver"
          echo "Cuda compilation tools, release {release}, V{full_version}"
          exit 0
        fi
        out=""
        while [ $# -gt 0 ]; do
          if [ "$1" = "-o" ]; then out="$2"; shift; fi
          shift
        done
        [ -n "$out" ] && : > "$out"
        """))
    path.chmod(0o755)


def _touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text or path.name)


def _dist_info(site: Path, pins) -> None:
    for pin in pins:
        name, version = pin.split("==")
        d = site / f"{name.replace('-', '_')}-{version}.dist-info"
        d.mkdir(parents=True)
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n")


def _cu13_tree(site: Path, nvcc_version: str = "13.0.88") -> None:
    top = site / "nvidia" / "cu13"
    _fake_nvcc(top / "bin" / "nvcc", nvcc_version)
    for rel in ("bin/ptxas", "bin/fatbinary", "bin/nvlink", "bin/cudafe++", "bin/nvcc.profile",
                "nvvm/bin/cicc", "nvvm/libdevice/libdevice.10.bc", "include/crt/host_config.h",
                "include/cuda_runtime.h", "include/cublas_v2.h", "include/cccl/cub/cub.cuh",
                "lib/libcudart.so.13", "lib/libcudart_static.a", "lib/libcublas.so.13",
                "lib/libcublasLt.so.13", "lib/libnvvm.so.4", "lib/cmake/cccl/cccl-config.cmake"):
        _touch(top / rel)
    _touch(site / "nvidia" / "__init__.py")


def _cu12_tree(site: Path) -> None:
    """The real CUDA 12 wheels' layout: nvidia-cuda-nvcc-cu12 has ptxas and libnvvm, no nvcc."""
    nv = site / "nvidia"
    for rel in ("cuda_nvcc/bin/ptxas", "cuda_nvcc/nvvm/lib64/libnvvm.so", "cuda_nvcc/include/crt/host_config.h",
                "cuda_runtime/include/cuda_runtime.h", "cuda_runtime/lib/libcudart.so.12",
                "cublas/include/cublas_v2.h", "cublas/lib/libcublas.so.12", "cublas/lib/libcublasLt.so.12",
                "cuda_cccl/include/cub/cub.cuh", "cuda_runtime/__init__.py", "cuda_runtime/lib/__init__.py"):
        _touch(nv / rel)


class FakeInstaller:
    """Stands in for ``pip install --target``: writes the layout and dist-info of the pins."""

    def __init__(self, layout: str, versions: dict[str, str] | None = None) -> None:
        self.layout, self.versions, self.calls = layout, versions or {}, 0

    def __call__(self, pins, target: Path) -> None:
        self.calls += 1
        installed = [p if p.split("==")[0] not in self.versions else f"{p.split('==')[0]}=={self.versions[p.split('==')[0]]}"
                     for p in pins]
        _dist_info(target, installed)
        if self.layout == "cu13":
            nvcc = next(p.split("==")[1] for p in installed if p.startswith("nvidia-cuda-nvcc=="))
            _cu13_tree(target, nvcc)
        else:
            _cu12_tree(target)


def _spec(**kw) -> CudaSpec:
    base = {"version": "13.0", "architectures": ("90-real",), "toolkit": "pypi", "packages": CU13_PINS,
            "runtime_requires": ("nvidia-cuda-runtime>=13.0,<14",), "fa_quants": None}
    base.update(kw)
    return CudaSpec(**base)


# ---------------------------------------------------------------------------- the stub

@needs_cc
def test_stub_soname_symbols_and_link(tmp_path):
    stub = cuda_stub.generate(tmp_path / "stubs")
    assert stub.name == "libcuda.so"
    assert read_dynamic(stub).soname == "libcuda.so.1"
    assert cuda_stub.exported_symbols(stub) == set(cuda_stub.DRIVER_SYMBOLS)
    assert os.readlink(tmp_path / "stubs" / "libcuda.so.1") == "libcuda.so"
    # A library using the VMM driver calls links against the stub with no undefined symbols
    # left, and records the real driver's SONAME as NEEDED.
    user = tmp_path / "user.c"
    user.write_text("int cuMemCreate(void); int cuDeviceGet(void);\n"
                    "int use(void) { return cuMemCreate() + cuDeviceGet(); }\n")
    out = tmp_path / "libuser.so"
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(out), str(user), f"-L{stub.parent}", "-lcuda",
                    "-Wl,--no-undefined"], check=True, capture_output=True)
    assert "libcuda.so.1" in read_dynamic(out).needed
    assert cuda_stub.undefined_driver_symbols(out) == {"cuMemCreate", "cuDeviceGet"}


def test_stub_source_rejects_bad_names():
    assert "int cuMemMap(void)" in cuda_stub.stub_source()
    with pytest.raises(ValueError, match="not a C identifier"):
        cuda_stub.stub_source(["cuMemMap; system()"])


def test_stub_symbols_cover_the_sources():
    """Every driver API call in the vendored ggml-cuda sources is exported by the stub."""
    src = REPO / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-cuda"
    if not src.is_dir():
        pytest.skip("vendor/llama.cpp is not unpacked")
    import re
    called = set()
    for f in list(src.glob("*.cu")) + list(src.glob("*.cuh")):
        called |= set(re.findall(r"\b(cu[A-Z][A-Za-z0-9_]*)\s*\(", f.read_text(errors="replace")))
    called.discard("cuBLAS")  # prose in comments and messages
    assert called <= set(cuda_stub.DRIVER_SYMBOLS), called - set(cuda_stub.DRIVER_SYMBOLS)


# ---------------------------------------------------------------------------- provisioning

@needs_cc
def test_provision_cuda13_layout(empty_cache):
    inst = FakeInstaller("cu13")
    kit = cuda_toolkit.provision(_spec(), installer=inst)
    root = kit.root
    assert root == empty_cache / "cuda" / cuda_toolkit.kit_hash(_spec()) / "toolkit"
    for sub in ("bin", "include", "lib64", "nvvm"):
        assert (root / sub).is_dir() and not (root / sub).is_symlink()
    assert os.readlink(root / "lib") == "lib64"
    # Unversioned development names point at the SONAME files.
    for plain, real in (("libcudart.so", "libcudart.so.13"), ("libcublas.so", "libcublas.so.13"),
                        ("libcublasLt.so", "libcublasLt.so.13")):
        assert os.readlink(root / "lib64" / plain) == real
        assert (root / "lib64" / plain).resolve() == (root.parent / "site/nvidia/cu13/lib" / real).resolve()
    # Farm links are relative, so they survived the rename from the staging directory.
    nvcc_link = os.readlink(root / "bin" / "nvcc")
    assert not os.path.isabs(nvcc_link) and (root / "bin" / "nvcc").resolve().is_file()
    assert (root / "nvvm/bin/cicc").exists() and (root / "include/cccl/cub/cub.cuh").exists()
    assert not (root / "__init__.py").exists() and not list(root.rglob("__init__.py"))
    # The generated stub.
    assert kit.stub_generated and read_dynamic(kit.driver_library).soname == "libcuda.so.1"
    # Versions: nvcc's banner and every pin, no paths.
    v = kit.versions
    assert v["nvcc"] == "Cuda compilation tools, release 13.0, V13.0.88"
    assert v["cuda_wheel:nvidia-cublas"] == "13.0.2.14" and v["cuda_wheel:nvidia-nvvm"] == "13.0.88"
    assert v["cuda_toolkit"] == "pypi" and not any(str(empty_cache) in x for x in v.values())
    stamp = json.loads((root.parent / "toolkit.json").read_text())
    assert stamp["nvcc_version"] == "13.0.88"
    assert inst.calls == 1
    # A second call is a cache hit: nothing installed again.
    again = cuda_toolkit.provision(_spec(), installer=inst)
    assert inst.calls == 1 and again.root == root and again.versions == v
    assert not list((empty_cache / "cuda").glob(".*.tmp-*"))


@needs_cc
def test_cmake_defines_and_env(empty_cache):
    kit = cuda_toolkit.provision(_spec(), installer=FakeInstaller("cu13"))
    d = kit.cmake_defines()
    root = kit.root
    assert d["CMAKE_CUDA_COMPILER"] == str(root / "bin" / "nvcc")
    assert d["CUDAToolkit_ROOT"] == str(root)
    assert d["CUDA_cublas_LIBRARY"] == str(root / "lib64" / "libcublas.so")
    assert d["CUDA_cublasLt_LIBRARY"] == str(root / "lib64" / "libcublasLt.so")
    assert d["CUDA_cuda_driver_LIBRARY"] == str(root / "lib64" / "stubs" / "libcuda.so")
    assert d["CMAKE_CUDA_FLAGS"] == f"-isystem {root / 'include'}"
    for key, value in d.items():
        if key != "CMAKE_CUDA_FLAGS":
            assert Path(value).exists(), key
    env = kit.env()
    assert env["PATH"].split(os.pathsep)[0] == str(root / "bin") and env["CUDA_HOME"] == str(root)
    no_vmm = replace(kit, spec=replace(kit.spec, no_vmm=True))
    assert "CUDA_cuda_driver_LIBRARY" not in no_vmm.cmake_defines()


@needs_cc
def test_pin_change_changes_the_kit_and_the_build_key(empty_cache, tmp_path):
    inst = FakeInstaller("cu13")
    spec_a = _spec()
    spec_b = _spec(packages=tuple(p if not p.startswith("nvidia-cublas==") else "nvidia-cublas==13.0.0.19"
                                  for p in CU13_PINS))
    assert cuda_toolkit.kit_hash(spec_a) != cuda_toolkit.kit_hash(spec_b)
    assert cuda_toolkit.kit_hash(spec_a) == cuda_toolkit.kit_hash(_spec(packages=tuple(reversed(CU13_PINS))))

    tree = VendoredTree(path=tmp_path, tree_sha256="0" * 64, source="test", commit="c" * 40, build_number=1)
    tc = Toolchain(cmake=Path("cmake"), ninja=Path("ninja"), cc=Path("cc"), cxx=Path("c++"), versions={"cc": "x"})
    config = load_matrix().get("cuda-13.0-dev")
    lock = load_lock()
    keys = {}
    for label, spec in (("a", spec_a), ("b", spec_b)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cuda_toolkit, "pip_install", inst)
            p = native.plan(replace(config, cuda=spec), lock, tree, tc)
        keys[label] = p.key
        pinned = dict(s.split("==") for s in spec.packages)["nvidia-cublas"]
        assert p.toolchain_versions["cuda_wheel:nvidia-cublas"] == pinned
        assert p.key_inputs["toolchain"]["cuda_wheel:nvidia-cublas"] == pinned
        assert p.extra_defines["CMAKE_CUDA_COMPILER"].endswith("/bin/nvcc") and p.env["CUDA_HOME"]
        assert "CMAKE_CUDA_COMPILER" not in p.defines  # paths stay out of the key
    assert keys["a"] != keys["b"]


@needs_cc
def test_installed_version_must_match_the_pin(empty_cache):
    inst = FakeInstaller("cu13", versions={"nvidia-cublas": "13.1.0.3"})
    with pytest.raises(NativeBuildError, match=r"nvidia-cublas 13\.1\.0\.3, but the configuration pins 13\.0\.2\.14"):
        cuda_toolkit.provision(_spec(), installer=inst)
    assert not list((empty_cache / "cuda").glob("*/toolkit.json"))  # nothing half-made was kept
    assert not list((empty_cache / "cuda").glob(".*.tmp-*"))


@needs_cc
def test_nvcc_release_must_match_the_version(empty_cache):
    inst = FakeInstaller("cu13", versions={"nvidia-cuda-nvcc": "13.1.80"})
    spec = _spec(packages=tuple(p if not p.startswith("nvidia-cuda-nvcc==") else "nvidia-cuda-nvcc==13.1.80"
                                for p in CU13_PINS))
    with pytest.raises(NativeBuildError, match=r"CUDA 13\.1\.80, but the configuration asks for CUDA 13\.0"):
        cuda_toolkit.provision(spec, installer=inst)


def test_missing_nvvm_names_the_wheel(empty_cache):
    def without_cicc(pins, target):
        FakeInstaller("cu13")(pins, target)
        os.unlink(target / "nvidia/cu13/nvvm/bin/cicc")

    with pytest.raises(NativeBuildError, match=r"nvvm/bin/cicc \(nvvm\): add nvidia-nvvm==13\.0\.88"):
        cuda_toolkit.provision(_spec(), installer=without_cicc)


def test_cuda12_wheels_have_no_compiler(empty_cache):
    spec = _spec(version="12.8", packages=CU12_PINS + ("nvidia-cuda-nvcc-cu12==12.8.93",))
    with pytest.raises(NativeBuildError) as err:
        cuda_toolkit.provision(spec, installer=FakeInstaller("cu12"))
    msg = str(err.value)
    assert "bin/nvcc (nvcc)" in msg and 'toolkit = "system"' in msg


@needs_cc
def test_system_toolkit_with_cuda12_wheels(empty_cache, tmp_path):
    """toolkit = "system": nvcc from CUDA_HOME, the pinned CUDA 12 wheels win for cudart/cuBLAS."""
    system = tmp_path / "cuda-12.8"
    _fake_nvcc(system / "bin" / "nvcc", "12.8.93")
    for rel in ("bin/ptxas", "bin/fatbinary", "bin/nvlink", "bin/cudafe++", "nvvm/bin/cicc",
                "nvvm/libdevice/libdevice.10.bc", "include/crt/host_config.h", "include/cuda_runtime.h",
                "lib64/libcudart.so.12", "lib64/libcudart_static.a"):
        _touch(system / rel, "system")
    spec = _spec(version="12.8", toolkit="system", packages=CU12_PINS)
    inst = FakeInstaller("cu12")
    kit = cuda_toolkit.provision(spec, installer=inst, environ={"CUDA_HOME": str(system), "PATH": ""})
    lib = kit.root / "lib64"
    assert (lib / "libcudart.so.12").resolve() == (kit.root.parent / "site/nvidia/cuda_runtime/lib/libcudart.so.12").resolve()
    assert (lib / "libcudart_static.a").resolve() == (system / "lib64/libcudart_static.a").resolve()
    assert os.readlink(lib / "libcublasLt.so") == "libcublasLt.so.12"
    assert kit.stub_generated and (lib / "stubs" / "libcuda.so").is_file()
    assert kit.versions["nvcc"].endswith("V12.8.93") and kit.versions["cuda_toolkit"] == "system"
    assert kit.versions["cuda_wheel:nvidia-cublas-cu12"] == "12.8.4.1"
    # The toolkit's own stub is used when it has one.
    shutil.rmtree(empty_cache)
    _touch(system / "lib64/stubs/libcuda.so", "nvidia's stub")
    kit2 = cuda_toolkit.provision(spec, installer=inst, environ={"CUDA_HOME": str(system), "PATH": ""})
    assert not kit2.stub_generated and kit2.driver_library.resolve() == (system / "lib64/stubs/libcuda.so").resolve()


def test_system_toolkit_not_found(empty_cache, tmp_path):
    with pytest.raises(NativeBuildError, match="set CUDA_HOME"):
        cuda_toolkit.system_root({"CUDA_HOME": str(tmp_path / "nope"), "PATH": str(tmp_path)}, defaults=())
    _fake_nvcc(tmp_path / "on-path" / "bin" / "nvcc", "12.8.93")
    found = cuda_toolkit.system_root({"PATH": str(tmp_path / "on-path" / "bin")}, defaults=())
    assert found == (tmp_path / "on-path").resolve()


# ---------------------------------------------------------------------------- the committed matrix

def test_committed_cuda_configs_are_consistent():
    m = load_matrix()
    for name in m.names():
        c = m.get(name)
        if c.cuda is None:
            continue
        spec = c.cuda
        pins = dict(p.split("==") for p in spec.packages)
        assert spec.major in _cuda_runtime._LAYOUTS
        if spec.toolkit == "pypi" and spec.major >= 13:
            # nvcc's unpinned dependencies are pinned to nvcc's own version.
            assert pins["nvidia-nvvm"] == pins["nvidia-cuda-crt"] == pins["nvidia-cuda-nvcc"]
            assert pins["nvidia-cuda-nvcc"].startswith(spec.version + ".")
        virtual = [a for a in spec.architectures if a.endswith("-virtual")]
        if name.endswith("-dev"):
            assert spec.architectures == ("90-real",) and not c.release
        else:
            assert len(virtual) == 1 and len(spec.architectures) >= 5, name
            # ggml rewrites 12X to the arch-specific 12Xa, whose PTX no other GPU can JIT.
            assert not virtual[0].startswith("12"), name
            assert spec.fa_quants, name
        for req in spec.runtime_requires:
            assert req.split(">=")[0] in pins or spec.toolkit == "system"


# ---------------------------------------------------------------------------- runtime discovery

def _so(path: Path, soname: str, link: list[Path] = ()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / (path.name.replace(".", "_") + ".c")
    src.write_text(f"int {soname.split('.')[0].replace('-', '_')}_marker(void) {{ return 1; }}\n")
    cmd = [CC, "-shared", "-fPIC", "-o", str(path), str(src), f"-Wl,-soname,{soname}", "-Wl,--no-as-needed"]
    for lib in link:
        cmd += [f"-L{lib.parent}", f"-l:{lib.name}"]
    subprocess.run(cmd, check=True, capture_output=True)
    src.unlink()
    return path


def _fake_site(root: Path, major: int) -> Path:
    if major == 13:
        lib = root / "nvidia" / "cu13" / "lib"
        dirs = {"cudart": lib, "cublasLt": lib, "cublas": lib}
    else:
        dirs = {"cudart": root / "nvidia/cuda_runtime/lib", "cublasLt": root / "nvidia/cublas/lib",
                "cublas": root / "nvidia/cublas/lib"}
    lt = _so(dirs["cublasLt"] / f"libcublasLt.so.{major}", f"libcublasLt.so.{major}")
    _so(dirs["cudart"] / f"libcudart.so.{major}", f"libcudart.so.{major}")
    _so(dirs["cublas"] / f"libcublas.so.{major}", f"libcublas.so.{major}", [lt])
    return root


@needs_cc
@pytest.mark.parametrize("major", [13, 12])
def test_runtime_discovery_both_layouts(tmp_path, major):
    site = _fake_site(tmp_path / "site-packages", major)
    found = _cuda_runtime.find_runtime(major, [tmp_path / "elsewhere", site])
    assert [lib.soname for lib in found] == [f"libcudart.so.{major}", f"libcublasLt.so.{major}", f"libcublas.so.{major}"]
    assert all(lib.path is not None and lib.path.is_file() for lib in found)
    other = 12 if major == 13 else 13
    missing = _cuda_runtime.find_runtime(other, [site])
    assert all(lib.path is None for lib in missing)
    assert missing[0].wheel == ("nvidia-cuda-runtime-cu12>=12,<13" if other == 12 else "nvidia-cuda-runtime>=13,<14")


@needs_cc
@pytest.mark.parametrize("major", [13, 12])
def test_preload_in_a_fresh_process(tmp_path, major):
    """preload() opens the wheel libraries RTLD_GLOBAL in order; a backend needing them then loads."""
    site = _fake_site(tmp_path / "site-packages", major)
    lib = site / ("nvidia/cu13/lib" if major == 13 else "nvidia/cuda_runtime/lib")
    blas = site / ("nvidia/cu13/lib" if major == 13 else "nvidia/cublas/lib")
    backend = _so(tmp_path / "backend" / "libggml-cuda.so", "libggml-cuda.so",
                  [lib / f"libcudart.so.{major}", blas / f"libcublas.so.{major}"])
    assert _cuda_runtime.cuda_major_of(backend) == major
    assert _cuda_runtime.needed(backend) == read_dynamic(backend).needed
    script = textwrap.dedent(f"""
        import ctypes, json, os, sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from llama_cpp._native import cuda_runtime as r
        try:
            ctypes.CDLL({str(backend)!r})
            before = "loaded"
        except OSError as exc:
            before = str(exc)
        assert r.default_backend() == Path({str(backend)!r})
        rep = r.preload(dirs=[Path({str(site)!r})])
        ctypes.CDLL({str(backend)!r})
        print(json.dumps({{"before": before, "major": rep.major, "loaded": rep.loaded, "missing": rep.missing}}))
    """)
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["LLAMA_CPP_LIB_PATH"] = str(backend.parent)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["before"] != "loaded":  # without preload the loader cannot see the wheels' directories
        assert "cannot open shared object file" in res["before"]
    assert res["major"] == major and not res["missing"]
    assert list(res["loaded"]) == [f"libcudart.so.{major}", f"libcublasLt.so.{major}", f"libcublas.so.{major}"]


def test_preload_reports_missing_with_the_wheel(tmp_path, monkeypatch):
    def refuse(path, mode):
        raise OSError(f"{path}: cannot open shared object file")

    monkeypatch.setattr(_cuda_runtime, "_dlopen", refuse)
    rep = _cuda_runtime.preload(13, dirs=[tmp_path])
    assert not rep.ok and not rep.loaded
    assert rep.missing["libcublas.so.13"] == "not found: pip install 'nvidia-cublas>=13,<14'"
    assert "nvidia-cuda-runtime>=13,<14" in rep.message()
    with pytest.raises(ValueError, match="CUDA 11 is not supported"):
        _cuda_runtime.preload(11, dirs=[tmp_path])
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path))
    with pytest.raises(ValueError, match="needs the CUDA major version"):
        _cuda_runtime.preload()


def test_site_dirs_finds_nvidia_namespaces(tmp_path, monkeypatch):
    (tmp_path / "a" / "nvidia").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "b"), str(tmp_path / "a"), str(tmp_path / "a")])
    dirs = _cuda_runtime.site_dirs()
    assert Path(tmp_path / "a") in dirs and Path(tmp_path / "b") not in dirs
    assert dirs.count(Path(tmp_path / "a")) == 1

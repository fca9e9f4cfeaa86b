"""The loader's Windows and macOS branches, with fake PE/Mach-O files and fake folders (no real DLLs)."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

from llama_cpp._native import binfmt as _binfmt
from llama_cpp._native import dll_search as _dll_search
from llama_cpp._native import loader as _loader
from llama_cpp._native.loader import DeviceInfo, loaded_status

from .fake_binaries import macho_dylib, macho_fat, pe_dll

WIN_ERROR = "Could not find module '{}' (or one of its dependencies). Try using the full path with constructor syntax."


@pytest.mark.windows
def test_pe_import_and_delay_tables_are_read():
    data = pe_dll(["ggml-base.dll", "KERNEL32.dll", "nvcuda.dll"], delay=["cublas64_12.dll"])
    deps = _binfmt.pe_dependencies(data)
    assert deps.format == "pe"
    assert deps.needed == ("ggml-base.dll", "KERNEL32.dll", "nvcuda.dll")
    assert deps.weak == ("cublas64_12.dll",)


@pytest.mark.macos
def test_macho_load_commands_are_read_from_thin_and_fat_files():
    arm = macho_dylib(["@rpath/libggml-base.dylib", "/usr/lib/libc++.1.dylib"], weak=["@rpath/libomp.dylib"],
                      install_name="@rpath/libllama.dylib", rpaths=["@loader_path"])
    deps = _binfmt.macho_dependencies(arm)
    assert deps.needed == ("@rpath/libggml-base.dylib", "/usr/lib/libc++.1.dylib")
    assert deps.weak == ("@rpath/libomp.dylib",)
    assert deps.install_name == "@rpath/libllama.dylib" and deps.rpaths == ("@loader_path",)
    x86 = macho_dylib(["/usr/lib/libSystem.B.dylib"], cpu=0x01000007)
    fat = macho_fat([(0x01000007, x86), (0x0100000C, arm)])
    assert _binfmt.macho_dependencies(fat).needed == deps.needed  # the arm64 slice is preferred
    assert _binfmt.macho_dependencies(fat, prefer_cpu=0x01000007).needed == ("/usr/lib/libSystem.B.dylib",)


@pytest.mark.parametrize("make", [
    pytest.param(lambda: pe_dll(["a.dll", "b.dll"], delay=["c.dll"]), marks=pytest.mark.windows),
    pytest.param(lambda: macho_dylib(["@rpath/liba.dylib"], rpaths=["@loader_path/x"]), marks=pytest.mark.macos)])
def test_truncated_headers_raise_value_error_never_read_past_the_end(make, tmp_path):
    data = make()
    f = tmp_path / "cut"
    for cut in [*range(0, len(data), 5), len(data) - 1]:
        f.write_bytes(data[:cut])
        with pytest.raises(ValueError):
            _binfmt.read_dependencies(f)
    f.write_bytes(data)
    assert _binfmt.read_dependencies(f).needed


def _site(tmp_path: Path, layout: dict[str, list[str]]) -> Path:
    root = tmp_path / "site-packages"
    for rel, files in layout.items():
        (root / rel).mkdir(parents=True, exist_ok=True)
        for f in files:
            (root / rel / f).write_bytes(b"MZ")
    return root


@pytest.mark.windows
def test_nvidia_dll_dirs_cover_cuda12_and_cuda13_layouts(tmp_path):
    # the pinned CUDA 13.0 wheels' folder (nvidia-cuda-runtime 13.0.96: nvidia/cu13/bin/x86_64)
    site = _site(tmp_path, {"nvidia/cu13/bin/x86_64": ["cudart64_13.dll", "cublas64_13.dll"],
                            "nvidia/cuda_runtime/bin": ["cudart64_12.dll"], "nvidia/cublas/bin": ["cublas64_12.dll"],
                            "nvidia/cu13/lib": ["cudart.lib"], "nvidia/empty/bin": []})
    assert _dll_search.nvidia_dll_dirs([site]) == [site / "nvidia/cu13/bin/x86_64", site / "nvidia/cuda_runtime/bin",
                                                   site / "nvidia/cublas/bin"]


@pytest.mark.windows
def test_dll_directories_are_ours_then_nvidias_and_never_the_cwd(tmp_path, monkeypatch):
    lib = tmp_path / "pkg" / "lib"
    lib.mkdir(parents=True)
    site = _site(tmp_path, {"nvidia/cu13/bin/x86_64": ["cudart64_13.dll"]})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "llama.dll").write_bytes(b"MZ")
    (cwd / "nvcuda.dll").write_bytes(b"MZ")
    monkeypatch.chdir(cwd)
    assert _dll_search.dll_directories(lib, cuda=False, sites=[site]) == [lib]
    dirs = _dll_search.dll_directories(lib, cuda=True, sites=[site])
    assert dirs == [lib, site / "nvidia/cu13/bin/x86_64"] and cwd not in dirs and Path(".") not in dirs
    added: list[str] = []
    handles = _dll_search.add_dll_directories(dirs, add=lambda d: added.append(d) or d)
    assert added == [str(d.resolve()) for d in dirs] and handles == added and all(os.path.isabs(a) for a in added)


@pytest.mark.windows
def test_windows_load_adds_dll_directories_before_loading_anything(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "ggml-cuda.dll").write_bytes(pe_dll(["nvcuda.dll"]))
    site = _site(tmp_path, {"nvidia/cuda_runtime/bin": ["cudart64_12.dll"]})
    calls: list[str] = []

    class Stop(Exception):
        pass

    def no_core(directory):
        calls.append("load_core")
        raise Stop

    monkeypatch.setattr(_loader, "sys", types.SimpleNamespace(platform="win32"))
    monkeypatch.setattr(_loader, "_state", None)
    monkeypatch.setattr(_loader, "_search_dirs", [])
    monkeypatch.setattr(_loader, "_dll_dirs", [])
    monkeypatch.setenv(_loader.ENV_LIB_PATH, str(lib))
    monkeypatch.setattr(_dll_search, "site_dirs", lambda: [site])
    monkeypatch.setattr(_dll_search, "add_dll_directories", lambda dirs: calls.append(("add", list(dirs))) or [])
    monkeypatch.setattr(_loader, "_load_core", no_core)
    with pytest.raises(Stop):
        _loader._load_locked()
    assert calls == [("add", [lib.resolve(), site / "nvidia/cuda_runtime/bin"]), "load_core"]


@pytest.mark.windows
def test_windows_core_lookup_is_the_package_lib_only(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    lib.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "llama.dll").write_bytes(b"MZ")
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(_loader, "sys", types.SimpleNamespace(platform="win32"))
    assert _loader._find_core(lib, "llama") is None
    (lib / "llama.dll").write_bytes(b"MZ")
    assert _loader._find_core(lib, "llama") == lib / "llama.dll"
    (lib / "ggml-cpu-haswell.dll").write_bytes(b"MZ")
    (lib / "ggml-base.dll").write_bytes(b"MZ")
    assert [p.name for p in _loader._backend_files(lib)] == ["ggml-cpu-haswell.dll"]


@pytest.fixture
def windows_tree(tmp_path):
    """lib\\ with a CUDA backend, NVIDIA's CUDA 12 wheel folder, and a System32 stand-in."""
    lib, system = tmp_path / "lib", tmp_path / "System32"
    lib.mkdir()
    system.mkdir()
    (lib / "ggml-cuda.dll").write_bytes(pe_dll(
        ["ggml-base.dll", "api-ms-win-crt-runtime-l1-1-0.dll", "cudart64_12.dll", "cublas64_12.dll",
         "KERNEL32.dll", "nvcuda.dll"]))
    (lib / "ggml-base.dll").write_bytes(pe_dll(["KERNEL32.dll", "MSVCP140.dll"]))
    site = _site(tmp_path, {"nvidia/cuda_runtime/bin": [], "nvidia/cublas/bin": ["cublas64_12.dll"]})
    (site / "nvidia/cuda_runtime/bin/cudart64_12.dll").write_bytes(pe_dll(["KERNEL32.dll"]))
    for name in ("kernel32.dll", "MSVCP140.dll"):
        (system / name).write_bytes(b"MZ")
    return types.SimpleNamespace(lib=lib, system=system, search=[lib, *_dll_search.nvidia_dll_dirs([site])],
                                 site=site)


def _explain(t) -> str:
    path = t.lib / "ggml-cuda.dll"
    return _dll_search.explain_load_error(WIN_ERROR.format(path), path, platform="win32", search=t.search,
                                          system=[t.system])


@pytest.mark.windows
def test_a_missing_nvcuda_dll_is_reported_as_no_driver(windows_tree):
    assert _explain(windows_tree) == "nvcuda.dll not found (NVIDIA driver not installed)"


@pytest.mark.windows
def test_a_missing_cuda_runtime_dll_names_the_wheels(windows_tree):
    (windows_tree.site / "nvidia/cuda_runtime/bin/cudart64_12.dll").unlink()
    assert _explain(windows_tree) == ("cudart64_12.dll not found (CUDA runtime not installed: install the "
                                      "package's nvidia-* wheels)")


@pytest.mark.windows
def test_a_dependency_of_our_own_dll_is_followed(windows_tree):
    (windows_tree.system / "MSVCP140.dll").unlink()
    assert _explain(windows_tree).startswith("MSVCP140.dll not found (Microsoft Visual C++ runtime not installed")


def _python_install(tmp_path, monkeypatch, *, executable: str, base_prefix: str) -> types.SimpleNamespace:
    """lib\\ whose CUDA backend imports the MSVC runtime and nvcuda.dll, a Windows folder without the VC++
    redistributable, and the interpreter as ``sys`` reports it (its folder holds vcruntime140.dll)."""
    lib, windows = tmp_path / "site" / "llama_cpp" / "lib", tmp_path / "Windows"
    lib.mkdir(parents=True)
    (windows / "System32").mkdir(parents=True)
    (windows / "System32" / "kernel32.dll").write_bytes(pe_dll([]))
    (lib / "ggml-cuda.dll").write_bytes(pe_dll(["KERNEL32.dll", "VCRUNTIME140.dll", "VCRUNTIME140_1.dll",
                                                "nvcuda.dll"]))
    monkeypatch.setenv("SystemRoot", str(windows))
    monkeypatch.setattr(sys, "_base_executable", executable, raising=False)
    monkeypatch.setattr(sys, "executable", executable)
    monkeypatch.setattr(sys, "base_prefix", base_prefix)
    path = lib / "ggml-cuda.dll"
    return types.SimpleNamespace(lib=lib, explain=lambda: _dll_search.explain_load_error(
        WIN_ERROR.format(path), path, platform="win32", search=[lib]))


def _vcruntime(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("vcruntime140.dll", "vcruntime140_1.dll"):
        (folder / name).write_bytes(pe_dll(["KERNEL32.dll"]))


@pytest.mark.windows
@pytest.mark.parametrize("where", ["executable", "base_prefix"])
def test_the_interpreters_vcruntime_is_found_so_the_driver_is_named(tmp_path, monkeypatch, where):
    """No VC++ redistributable in System32: CPython's own vcruntime140.dll (beside python.exe, which
    Windows searches for every DLL) serves, so the missing DLL named is the driver's."""
    python = tmp_path / "Python312"
    _vcruntime(python)
    venv = tmp_path / "venv" / "Scripts"
    venv.mkdir(parents=True)
    if where == "executable":
        t = _python_install(tmp_path, monkeypatch, executable=str(python / "python.exe"), base_prefix=str(venv))
    else:  # a venv: its Scripts\python.exe is a launcher; the base installation holds the runtime
        t = _python_install(tmp_path, monkeypatch, executable=str(venv / "python.exe"), base_prefix=str(python))
    assert t.explain() == "nvcuda.dll not found (NVIDIA driver not installed)"
    assert python in _dll_search._system_dirs()


@pytest.mark.windows
def test_the_interpreter_folder_is_never_the_current_directory(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    _vcruntime(cwd)
    (cwd / "nvcuda.dll").write_bytes(pe_dll([]))
    monkeypatch.chdir(cwd)
    t = _python_install(tmp_path, monkeypatch, executable="", base_prefix="")
    assert t.explain().startswith("VCRUNTIME140.dll not found (Microsoft Visual C++ runtime not installed")
    monkeypatch.setattr(sys, "executable", "python.exe")
    monkeypatch.setattr(sys, "_base_executable", "python.exe", raising=False)
    assert _dll_search._interpreter_dirs() == [] and t.explain().startswith("VCRUNTIME140.dll not found")
    assert all(d.is_absolute() for d in _dll_search._system_dirs())


@pytest.mark.windows
def test_the_interpreter_folder_is_searched_by_the_explainer_only(tmp_path, monkeypatch):
    python = tmp_path / "Python312"
    _vcruntime(python)
    t = _python_install(tmp_path, monkeypatch, executable=str(python / "python.exe"), base_prefix=str(python))
    assert python not in _dll_search.dll_directories(t.lib, cuda=True, sites=[])


@pytest.mark.macos
def test_macos_loader_errors_name_the_missing_dylib():
    msg = ("dlopen(/site/llama_cpp/lib/libggml-vulkan.so, 0x0006): Library not loaded: @rpath/libvulkan.1.dylib\n"
           "  Referenced from: <UUID> /site/llama_cpp/lib/libggml-vulkan.so\n  Reason: tried: '/x/libvulkan.1.dylib'")
    assert _dll_search.explain_load_error(msg, platform="darwin") == \
        "libvulkan.1.dylib not found (Vulkan loader not installed)"
    assert _dll_search.explain_load_error("dlopen(x): Symbol not found: _ggml_foo\n", platform="darwin") == \
        "undefined symbol _ggml_foo (the backend does not match libggml: mixed builds?)"


def test_a_gpu_backend_without_a_device_is_not_serving(tmp_path):
    path = tmp_path / "libggml-metal.so"
    none = loaded_status("metal", "MTL", path, [])
    assert not none.loaded and none.reason.startswith("loaded, but found no Metal device")
    vk = loaded_status("vulkan", "Vulkan", None, [])
    assert not vk.loaded and "no Vulkan device" in vk.reason
    gpu = DeviceInfo("MTL0", "Apple M2", "GPU", 1, 2)
    assert loaded_status("metal", "MTL", path, [gpu]).loaded
    assert loaded_status("cpu", "CPU", None, []).loaded  # the CPU backend always serves


def test_require_gpu_names_the_missing_device(monkeypatch):
    statuses = [_loader.BackendStatus("CPU", None, True, None, [DeviceInfo("CPU", "cpu", "CPU", 1, 1)]),
                loaded_status("metal", "MTL", None, [])]
    libs = _loader.Libraries(Path("/x"), None, None, None, None, {}, statuses)  # type: ignore[arg-type]
    with pytest.raises(_loader.BackendUnavailableError, match="MTL backend not loaded: loaded, but found no Metal"):
        _loader.ensure_backends(True, _libs=libs)
    _loader.ensure_backends(False, _libs=libs)  # CPU service without the requirement

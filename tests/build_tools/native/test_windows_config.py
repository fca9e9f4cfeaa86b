"""The MinGW-w64 configurations: parsing, the Windows toolchain file, the key, the win_amd64 tag, the
.exe programs, and the repair helpers that need no wheel (runtime folders, the __init__ patch rules)."""

from __future__ import annotations

import copy
import dataclasses
import shutil
import sys
from pathlib import Path

import pytest

from build_tools.common import pe
from build_tools.common.compilers import detect
from build_tools.common.paths import CONFIGS_FILE
from build_tools.errors import ConfigError, ToolNotFoundError
from build_tools.inputs.configs import load_matrix, parse_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages.native import build as native
from build_tools.stages.native import cross_toolchain
from build_tools.stages.native.manifest import describe_library
from build_tools.stages.wheels import repair_windows
from build_tools.stages.wheels.build import target_platform_tag

from ...syspkgs import require_apt, require_cross
from ..fake_pe import make_pe
from ..windows_fakes import patch_block
from .fake_tree import make_fake_tree

pytestmark = pytest.mark.windows

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def _raw() -> dict:
    return tomllib.loads(CONFIGS_FILE.read_text())


def test_committed_windows_configurations():
    m = load_matrix()
    full, dev = m.get("cpu-windows"), m.get("cpu-windows-dev")
    for c in (full, dev):
        assert c.cross is not None and c.cross.triple == "x86_64-w64-mingw32" and c.cross.system_name == "Windows"
        assert "g++-mingw-w64-x86-64-posix" in c.cross.apt
        assert not c.release and dict(c.cmake)["GGML_OPENMP"] == "OFF"
        assert "THREAD_POWER_THROTTLING_STATE=PROCESS_POWER_THROTTLING_STATE" in dict(c.cmake)["CMAKE_C_FLAGS"]
    assert full.cpu_variants == "all" and dev.cpu_variants == "single"
    assert dict(dev.cmake)["GGML_AVX2"] == "ON"
    # every variant (AMX included) needs clang; the one-backend build keeps MinGW's GCC
    assert full.cross.compiler == "clang-19" and "clang-19" in full.cross.apt
    # clang over GCC's libstdc++: GCC's emulated TLS, libwinpthread linked, mingw-w64 10's __cpuidex set aside
    for flags in (dict(full.cmake)["CMAKE_C_FLAGS"], dict(full.cmake)["CMAKE_CXX_FLAGS"]):
        assert {"-femulated-tls", "-pthread", "-D__INTRINSIC_DEFINED___cpuidex"} <= set(flags.split())
    assert "CMAKE_CXX_FLAGS" not in dict(dev.cmake)
    assert dev.cross.compiler == "gcc-posix" and "clang-19" not in dev.cross.apt


@pytest.mark.parametrize("mutate, needle", [
    (lambda c: c["cross"].update(compiler="gcc-posix", system_name="Linux"), "needs system_name = \"Windows\""),
    (lambda c: c["cross"].update(compiler="gcc-mcf"), "'gcc-posix' / 'gcc-win32'"),
    (lambda c: c["cross"].update(system_name="windows"), "system_name"),
])
def test_bad_windows_cross_tables_are_refused(mutate, needle):
    data = copy.deepcopy(_raw())
    mutate(next(c for c in data["config"] if c["name"] == "cpu-windows"))
    with pytest.raises(ConfigError) as info:
        parse_matrix(data)
    assert needle in str(info.value)


def test_mingw_compilers_and_toolchain_file():
    spec = load_matrix().get("cpu-windows-dev").cross
    assert cross_toolchain.compiler_names(spec) == ("x86_64-w64-mingw32-gcc-posix", "x86_64-w64-mingw32-g++-posix")
    win32 = dataclasses.replace(spec, compiler="gcc-win32")
    assert cross_toolchain.compiler_names(win32)[1] == "x86_64-w64-mingw32-g++-win32"
    lines = cross_toolchain.toolchain_file_text(spec, Path("/usr/bin/x86_64-w64-mingw32-gcc-posix"),
                                                Path("/usr/bin/x86_64-w64-mingw32-g++-posix")).splitlines()
    assert "set(CMAKE_SYSTEM_NAME Windows)" in lines and "set(CMAKE_SYSTEM_PROCESSOR x86_64)" in lines
    assert 'set(CMAKE_RC_COMPILER "/usr/bin/x86_64-w64-mingw32-windres")' in lines
    assert 'set(CMAKE_FIND_ROOT_PATH "/usr/x86_64-w64-mingw32")' in lines
    aarch64 = load_matrix().get("cpu-aarch64-dev").cross
    assert "RC_COMPILER" not in cross_toolchain.toolchain_file_text(aarch64, Path("/a-gcc"), Path("/a-g++"))


def test_clang_toolchain_file_for_windows():
    spec = load_matrix().get("cpu-windows").cross
    assert cross_toolchain.compiler_names(spec) == ("clang-19", "clang++-19")
    lines = cross_toolchain.toolchain_file_text(spec, Path("/usr/bin/clang-19"), Path("/usr/bin/clang++-19")).splitlines()
    assert "set(CMAKE_C_COMPILER_TARGET x86_64-w64-mingw32)" in lines
    assert 'set(CMAKE_RC_COMPILER "/usr/bin/x86_64-w64-mingw32-windres")' in lines


def test_amx_probe_refuses_mingw_gcc12_and_accepts_clang():
    full = load_matrix().get("cpu-windows").cross
    require_cross("cpu-windows")
    gcc, clang = shutil.which("x86_64-w64-mingw32-gcc-posix"), shutil.which("clang-19")
    assert gcc is not None and clang is not None
    with pytest.raises(ToolNotFoundError, match="sapphirerapids .AMX. variant.*clang-19"):
        cross_toolchain.check_all_variants(dataclasses.replace(full, compiler="gcc-posix"), Path(gcc))
    cross_toolchain.check_all_variants(full, Path(clang))


def test_windows_plan_keys_on_the_mingw_compiler(tmp_path, monkeypatch):
    require_cross("cpu-windows-dev", "cpu-windows")  # the second plan needs clang-19 too
    monkeypatch.setenv("LLAMA_CPP_PYTHON_CACHE", str(tmp_path / "cache"))
    tree, host = make_fake_tree(tmp_path / "tree"), detect()
    p = native.plan(load_matrix().get("cpu-windows-dev"), load_lock(), tree, host, install=False)
    v = p.toolchain_versions
    assert v["system"] == "Windows" and v["cross"] == "x86_64-w64-mingw32" and "libc" not in v
    assert "x86_64-w64-mingw32-gcc-posix" in v["cc"] and v["apt:mingw-w64-x86-64-dev"]
    # the configuration's C flags come first on the configure line; the path maps are appended
    flags = next(a for a in native._configure_cmd(p, tmp_path / "b") if a.startswith("-DCMAKE_C_FLAGS="))
    assert flags.startswith("-DCMAKE_C_FLAGS=-DTHREAD_POWER_THROTTLING_STATE=") and "-ffile-prefix-map=" in flags
    assert native.plan(load_matrix().get("cpu-windows"), load_lock(), tree, host, install=False).key != p.key


def test_existing_configure_lines_keep_their_flags(tmp_path):
    tree, host = make_fake_tree(tmp_path / "tree"), detect()
    p = native.plan(load_matrix().get("cpu-host"), load_lock(), tree, host)
    flags = next(a for a in native._configure_cmd(p, tmp_path / "b") if a.startswith("-DCMAKE_C_FLAGS="))
    assert flags.startswith("-DCMAKE_C_FLAGS=-ffile-prefix-map=")


def test_windows_wheels_are_win_amd64_and_programs_exe():
    m = load_matrix()
    assert target_platform_tag(m.get("cpu-windows-dev"), "linux_x86_64") == "win_amd64"
    with pytest.raises(ConfigError, match="cross target"):
        target_platform_tag(m.get("cpu-windows-dev"), "linux_aarch64")
    assert native.exe_suffix(m.get("cpu-windows")) == ".exe"
    assert native.exe_suffix(m.get("cpu-aarch64")) == ""


def test_pe_manifest_record(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "ggml-cpu.dll").write_bytes(make_pe(["KERNEL32.dll", "ggml-base.dll"], ["nvcuda.dll"]))
    rec = describe_library(tmp_path, "lib/ggml-cpu.dll")
    assert rec.soname == "ggml-cpu.dll" and rec.needed == ("KERNEL32.dll", "ggml-base.dll", "nvcuda.dll")
    assert rec.runpath == () and rec.size == (tmp_path / "lib" / "ggml-cpu.dll").stat().st_size


def test_pe_reader_and_classes(tmp_path):
    image = pe.parse_pe(make_pe(["KERNEL32.dll"], ["nvcuda.dll"]))
    assert image.machine == "x86_64" and image.is_dll and image.imports == ("KERNEL32.dll", "nvcuda.dll")
    assert pe.parse_pe(make_pe(machine=0xAA64, dll=False)).machine == "arm64"
    for bad in (b"", b"MZ" + b"\0" * 10, make_pe(["a.dll"])[:0x20C]):
        with pytest.raises(ValueError):
            pe.parse_pe(bad)
    path = tmp_path / "x.dll"
    path.write_bytes(b"ELF")
    with pytest.raises(ValueError, match="x.dll"):
        pe.read_pe(path)
    assert pe.is_system_dll("KERNEL32.dll") and pe.is_system_dll("api-ms-win-crt-runtime-l1-1-0.dll")
    assert not pe.is_system_dll("libstdc++-6.dll") and not pe.is_system_dll("nvcuda.dll")
    assert all(pe.is_driver_dll(n) for n in ("nvcuda.dll", "vulkan-1.dll", "cudart64_12.dll", "cublasLt64_13.dll",
                                             "nvcuda-0123abcd.dll"))
    assert not pe.is_driver_dll("ggml-cuda.dll") and not pe.is_driver_dll("libstdc++-6.dll")


def test_patch_rules():
    original = b'"""doc"""\nfrom __future__ import annotations\n\nimport os\n'
    from ..windows_fakes import patched_init

    patched = patched_init(original)
    assert original in repair_windows.unpatched_init(patched, "llama_cpp_python.libs")
    with pytest.raises(ValueError, match="expected one delvewheel patch block, found 0"):
        repair_windows.unpatched_init(original, "llama_cpp_python.libs")
    with pytest.raises(ValueError, match="found 2"):
        repair_windows.unpatched_init(patched_init(patched), "llama_cpp_python.libs")
    with pytest.raises(ValueError, match="imports more than os"):
        repair_windows.unpatched_init(patched_init(original, patch_block(extra="    import ctypes\n")),
                                      "llama_cpp_python.libs")
    with pytest.raises(ValueError, match="not Python"):
        repair_windows.unpatched_init(patched_init(original, patch_block(extra="    )(\n")), "llama_cpp_python.libs")


def test_runtime_dirs_come_from_the_cross_compiler():
    config = load_matrix().get("cpu-windows-dev")
    assert repair_windows.runtime_dirs(load_matrix().get("cpu")) == []
    require_apt(["g++-mingw-w64-x86-64-posix"], "the MinGW-w64 runtime folders")
    dirs = repair_windows.runtime_dirs(config)
    found = {p.name for d in dirs for p in d.glob("*.dll")}
    assert {"libstdc++-6.dll", "libgcc_s_seh-1.dll", "libwinpthread-1.dll"} <= found
    if cross_toolchain.shutil.which("clang-19") is not None:  # clang over the same GCC: the same folders
        assert repair_windows.runtime_dirs(load_matrix().get("cpu-windows")) == dirs

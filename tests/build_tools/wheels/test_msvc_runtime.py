"""Wheels of an MSVC-toolchain build (the windows-2022 release rows): the libraries import the MSVC C++
runtime; delvewheel grafts MSVCP140.dll and leaves VCRUNTIME140.dll / VCRUNTIME140_1.dll to CPython,
which ships them beside python.exe. validate and repair accept exactly that, per the wheel's tag."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from build_tools.common import pe
from build_tools.common.interpreters import VERSIONS
from build_tools.inputs.configs import load_matrix
from build_tools.stages import validate
from build_tools.stages.wheels import build as wheels
from build_tools.stages.wheels.repair_windows import graft_problems

from ...native_fakes import fake_native_build
from ..fake_pe import make_pe
from ..windows_fakes import LIBS, graft

pytestmark = pytest.mark.windows

CRT = ("api-ms-win-crt-runtime-l1-1-0.dll", "api-ms-win-crt-heap-l1-1-0.dll", "api-ms-win-crt-string-l1-1-0.dll")
MSVC = ("MSVCP140.dll", "VCRUNTIME140.dll", "VCRUNTIME140_1.dll", *CRT, "KERNEL32.dll")
# The import graph of a clang build against the MSVC toolchain with /MD (llama.cpp's Windows release).
LIBRARIES = {
    "ggml-base.dll": MSVC,
    "ggml.dll": ("ggml-base.dll", *MSVC),
    "ggml-cpu-haswell.dll": ("ggml-base.dll", "ADVAPI32.dll", *MSVC),
    "llama.dll": ("ggml.dll", "ggml-base.dll", *MSVC),
    "mtmd.dll": ("llama.dll", "ggml.dll", "ggml-base.dll", *MSVC),
}
# MSVCP140.dll as System32 holds it: the C runtime's API sets, VCRUNTIME140(_1).dll, concrt140 delay-loaded.
MSVCP = make_pe(["VCRUNTIME140.dll", "VCRUNTIME140_1.dll", *CRT, "KERNEL32.dll"], delay=["concrt140.dll"],
                payload=b"msvcp140")
GRAFTS = {"msvcp140.dll": MSVCP}


@pytest.fixture(scope="module")
def msvc_native(tmp_path_factory):
    config = load_matrix().get("cpu-windows-msvc")
    root = tmp_path_factory.mktemp("msvcnative") / "cpu-windows-msvc-fake"
    libraries = {name: make_pe(imports, payload=name.encode()) for name, imports in LIBRARIES.items()}
    return fake_native_build(root, config, libraries, ("cpu-haswell",))


@pytest.fixture(scope="module")
def msvc_wheels(msvc_native, win_repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("msvcdist") / "cpu-windows-msvc"
    options = wheels.WheelOptions(out_dir=out, python_tags=("cp310", "cp313"), platform_tag="win_amd64",
                                  repo=win_repo, epoch=315532800)
    return wheels.build_wheels(msvc_native, msvc_native.config, options)


def _validate(msvc_native, win_repo, msvc_wheels, tmp_path, **tamper):
    paths = [graft(w.path, tmp_path / "out" / w.path.name, **{"grafts": GRAFTS, **tamper})
             for w in msvc_wheels]
    built = [replace(w, path=p) for w, p in zip(msvc_wheels, paths)]
    return validate.validate(built, msvc_native.manifest, msvc_native.config, version=msvc_wheels[0].version,
                             python_tags=sorted({w.python_tag for w in built}), twine=False, repo=win_repo)


def _messages(report, check):
    return [f.message for w in report.wheels for f in w.failures if f.check == check]


def test_msvc_built_wheels_with_msvcp140_grafted_pass(msvc_native, win_repo, msvc_wheels, tmp_path):
    report = _validate(msvc_native, win_repo, msvc_wheels, tmp_path)
    assert report.ok, report.render()


def test_a_grafted_vcruntime_or_driver_is_still_refused(msvc_native, win_repo, msvc_wheels, tmp_path):
    grafts = {**GRAFTS, "vcruntime140.dll": make_pe(["KERNEL32.dll"]), "nvcuda.dll": make_pe(["KERNEL32.dll"]),
              "cudart64_13.dll": make_pe(["KERNEL32.dll"])}
    report = _validate(msvc_native, win_repo, msvc_wheels, tmp_path, grafts=grafts)
    msgs = _messages(report, "graft")
    assert any("vcruntime140.dll: CPython ships it beside python.exe" in m for m in msgs), report.render()
    assert any("nvcuda.dll: a GPU driver" in m for m in msgs) and any("cudart64_13.dll: a GPU driver" in m
                                                                          for m in msgs)


def test_msvcp140_must_be_grafted(msvc_native, win_repo, msvc_wheels, tmp_path):
    report = _validate(msvc_native, win_repo, msvc_wheels, tmp_path, drop=(f"{LIBS}/msvcp140.dll",))
    msgs = _messages(report, "dll-dependency")
    assert any("imports MSVCP140.dll, which is not in the wheel" in m for m in msgs), report.render()
    assert not any("VCRUNTIME140" in m for m in msgs)


def _wheel_files(imports=MSVC, grafts=GRAFTS):
    files = {f"llama_cpp/lib/{n}": make_pe(list(imports), payload=n.encode()) for n in ("ggml-base.dll",)}
    files.update({f"{LIBS}/{n}": d for n, d in grafts.items()})
    return files


@pytest.mark.parametrize("abi, platform, accepted", [
    ("cp310", "win_amd64", True), ("cp314", "win_amd64", True), ("cp314t", "win_amd64", True),
    ("cp312", "win_arm64", True),
    ("cp312", "win32", False),  # 32-bit CPython ships VCRUNTIME140.dll only
    ("abi3", "win_amd64", False), ("cp312d", "win_amd64", False), ("none", "win_amd64", False),
])
def test_only_what_cpython_ships_for_the_tag_is_accepted(abi, platform, accepted):
    problems = graft_problems(_wheel_files(), ["ggml-base.dll"], LIBS, pe.python_dlls(abi, platform))
    missing = sorted({re.search(r"imports (\S+),", m).group(1) for _c, m in problems})
    assert missing == ([] if accepted else (["VCRUNTIME140_1.dll"] if platform == "win32"
                                            else ["VCRUNTIME140.dll", "VCRUNTIME140_1.dll"]))


def test_other_msvc_runtime_dlls_still_need_a_graft():
    """Only CPython's two DLLs are given: the rest of the redistributable (the C++ library's satellite
    DLLs, OpenMP) must be in the wheel."""
    imports = (*MSVC, "MSVCP140_CODECVT_IDS.dll", "VCOMP140.DLL", "concrt140.dll")
    problems = graft_problems(_wheel_files(imports), ["ggml-base.dll"], LIBS, pe.python_dlls("cp312", "win_amd64"))
    assert sorted(re.search(r"imports (\S+),", m).group(1) for _c, m in problems) == \
        ["MSVCP140_CODECVT_IDS.dll", "VCOMP140.DLL", "concrt140.dll"]


def test_concrt140_is_ignored_only_as_msvcp140s_delay_load():
    other = make_pe(["KERNEL32.dll"], delay=["concrt140.dll"])
    problems = graft_problems(_wheel_files(grafts={**GRAFTS, "other.dll": other}), ["ggml-base.dll"], LIBS,
                              pe.python_dlls("cp312", "win_amd64"))
    deps = [m for c, m in problems if c == "dll-dependency"]
    assert deps == [f"{LIBS}/other.dll imports concrt140.dll, which is not in the wheel and not part of Windows "
                    "or CPython: graft it (delvewheel --add-path <folder with it>) or link it statically"]


def test_the_table_is_delvewheels():
    """pe.python_dlls and pe.IGNORED_IMPORTS say what the pinned delvewheel assumes for every tag we build."""
    dll_list = pytest.importorskip("delvewheel._dll_list")
    for version in VERSIONS:
        for abi in (f"cp{version.replace('.', '')}", f"cp{version.replace('.', '')}t"):
            if abi.endswith("t") and version < "3.13":
                continue
            for platform in ("win_amd64", "win_arm64", "win32"):
                theirs = next((dlls for pattern, dlls in dll_list.ignore_by_abi_platform.items()
                               if re.fullmatch(pattern, f"{abi}-{platform}")), set())
                assert pe.python_dlls(abi, platform) == theirs, (abi, platform)
    assert {k: set(v) for k, v in pe.IGNORED_IMPORTS.items()} == dll_list.ignore_dependency

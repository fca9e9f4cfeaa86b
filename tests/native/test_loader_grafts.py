"""The loader on a repaired Windows wheel: delvewheel's graft folder is searched, so a missing DLL is
named correctly instead of the grafted runtime being reported missing."""

from __future__ import annotations

import pytest

from build_tools.stages.wheels.build import read_project
from build_tools.stages.wheels.repair_windows import libs_dir
from llama_cpp._native import dll_search as _dll_search

from ..build_tools.fake_pe import make_pe

pytestmark = pytest.mark.windows


def _installed(tmp_path, grafted: bool):
    site = tmp_path / "site-packages"
    lib = site / "llama_cpp" / "lib"
    lib.mkdir(parents=True)
    (lib / "ggml-base.dll").write_bytes(make_pe(["KERNEL32.dll", "libstdc++-6.dll"]))
    (lib / "libllama.dll").write_bytes(make_pe(["KERNEL32.dll", "libstdc++-6.dll", "ggml-base.dll", "ggml.dll"]))
    if grafted:
        (site / _dll_search.GRAFT_DIR).mkdir()
        (site / _dll_search.GRAFT_DIR / "libstdc++-6.dll").write_bytes(make_pe(["KERNEL32.dll"]))
    system = tmp_path / "System32"
    system.mkdir()
    (system / "kernel32.dll").write_bytes(make_pe([]))
    return site, lib, system


def test_graft_folder_is_the_one_repair_writes():
    assert libs_dir(read_project().dist_name) == _dll_search.GRAFT_DIR


def test_graft_folder_is_added_after_lib(tmp_path):
    site, lib, _ = _installed(tmp_path, grafted=True)
    assert _dll_search.dll_directories(lib, cuda=False, sites=[site]) == [lib, site / _dll_search.GRAFT_DIR]
    site2, lib2, _ = _installed(tmp_path / "plain", grafted=False)
    assert _dll_search.dll_directories(lib2, cuda=False, sites=[site2]) == [lib2]


def test_missing_dll_is_named_past_the_grafted_runtime(tmp_path):
    site, lib, system = _installed(tmp_path, grafted=True)
    search = _dll_search.dll_directories(lib, cuda=False, sites=[site])
    assert _dll_search.missing_windows_dependency(lib / "libllama.dll", search, [system]) == "ggml.dll"
    # without the graft folder the runtime itself is (wrongly, for a repaired wheel) the first missing DLL
    assert _dll_search.missing_windows_dependency(lib / "libllama.dll", [lib], [system]) == "libstdc++-6.dll"
    message = _dll_search.explain_load_error("Could not find module 'libllama.dll' (or one of its dependencies)",
                                             lib / "libllama.dll", platform="win32", search=search, system=[system])
    assert message.startswith("ggml.dll not found")

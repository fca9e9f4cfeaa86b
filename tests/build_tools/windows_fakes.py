"""Fixtures and helpers of the Windows tests (imported by the conftest of each folder that uses them): a stand-in MinGW native build made of fake PE DLLs, its wheels, and
a stand-in for delvewheel's graft (its effect on a wheel, as observed on the real cross build)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from build_tools.inputs.configs import load_matrix
from build_tools.stages.native.build import NativeBuild
from build_tools.stages.wheels import build as wheels
from build_tools.stages.wheels.inwheel import Entry, read_entries, write_wheel
from build_tools.stages.wheels.repair_windows import DELVEWHEEL_RECORD, INIT

from ..native_fakes import fake_native_build, snapshot_sources
from .fake_pe import make_pe

# The configuration the real-build and Wine tests look for (nox -s windows -- CONFIG sets it).
CONFIG = os.environ.get("LLAMA_CPP_WINDOWS_CONFIG", "cpu-windows-dev")
RUNTIME = ("libstdc++-6.dll", "libgcc_s_seh-1.dll", "libwinpthread-1.dll")
CRT = ("KERNEL32.dll", "msvcrt.dll")
# The import graph of the real MinGW build (native-manifest.json of cpu-windows-dev).
LIBRARIES = {
    "ggml-base.dll": (*CRT, *RUNTIME),
    "ggml.dll": (*CRT, "libgcc_s_seh-1.dll", "libstdc++-6.dll", "ggml-base.dll"),
    "ggml-cpu.dll": ("ADVAPI32.dll", *CRT, *RUNTIME, "ggml-base.dll"),
    "libllama.dll": (*CRT, *RUNTIME, "ggml-base.dll", "ggml.dll"),
    "libmtmd.dll": (*CRT, "libgcc_s_seh-1.dll", "libstdc++-6.dll", "ggml-base.dll", "ggml.dll", "libllama.dll"),
}
GRAFTS = {
    "libstdc++-6.dll": make_pe([*CRT, "libgcc_s_seh-1.dll", "libwinpthread-1.dll"], payload=b"stdc++"),
    "libgcc_s_seh-1.dll": make_pe([*CRT, "libwinpthread-1.dll"], payload=b"gcc_s"),
    "libwinpthread-1.dll": make_pe(list(CRT), payload=b"winpthread"),
}
LIBS = "llama_cpp_python.libs"


def patch_block(libs: str = LIBS, extra: str = "") -> bytes:
    """A DLL-directory patch block of the shape delvewheel inserts (``extra``: lines smuggled in)."""
    return (
        "\n# start delvewheel patch\n"
        "def _delvewheel_patch_1_13_2():\n"
        "    import os\n"
        f"    libs_dir = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, {libs!r}))\n"
        "    if os.path.isdir(libs_dir):\n"
        "        os.add_dll_directory(libs_dir)\n"
        f"{extra}"
        "\n\n_delvewheel_patch_1_13_2()\n"
        "del _delvewheel_patch_1_13_2\n"
        "# end delvewheel patch\n\n"
    ).encode()


def patched_init(original: bytes, block: bytes | None = None) -> bytes:
    """``original`` with a patch block inserted before its first import, as delvewheel places it."""
    at = original.index(b"\nimport ") + 1
    return original[:at] + (patch_block() if block is None else block) + original[at:]


def graft(wheel: Path, out: Path, *, grafts: dict[str, bytes] | None = None, drop: tuple[str, ...] = (),
          replace: dict[str, bytes] | None = None, block: bytes | None = None) -> Path:
    """What ``delvewheel repair --no-mangle-all`` does to ``wheel``: the DLLs under <dist>.libs/, the
    __init__ patch and the DELVEWHEEL record; ``drop``/``replace`` tamper with the result."""
    entries = {e.name: e for e in read_entries(wheel)}
    dist_info = next(n.split("/")[0] for n in entries if n.split("/")[0].endswith(".dist-info"))
    for name, data in (GRAFTS if grafts is None else grafts).items():
        entries[f"{LIBS}/{name}"] = Entry(f"{LIBS}/{name}", data)
    entries[INIT] = Entry(INIT, patched_init(entries[INIT].data, block))
    entries[f"{dist_info}/{DELVEWHEEL_RECORD}"] = Entry(f"{dist_info}/{DELVEWHEEL_RECORD}", b"Version: 1.13.2\n")
    for name in drop:
        entries.pop(name)
    for name, data in (replace or {}).items():
        entries[name] = Entry(name, data, entries[name].executable if name in entries else False)
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_wheel(out, entries.values(), dist_info, 315532800)


@pytest.fixture(scope="session")
def win_config():
    return load_matrix().get(CONFIG)


@pytest.fixture(scope="session")
def win_repo(tmp_path_factory) -> Path:
    """A snapshot of the package sources (the working tree may change while the tests run)."""
    root = tmp_path_factory.mktemp("winrepo")
    return snapshot_sources(root)


@pytest.fixture(scope="session")
def fake_native(win_config, tmp_path_factory) -> NativeBuild:
    """A stand-in native build of the MinGW configuration: fake PE DLLs with the real import graph."""
    root = tmp_path_factory.mktemp("winnative") / f"{CONFIG}-fake"
    libraries = {name: make_pe(imports, payload=name.encode()) for name, imports in LIBRARIES.items()}
    return fake_native_build(root, win_config, libraries, ("cpu",))


@pytest.fixture(scope="session")
def fake_wheels(fake_native, win_config, win_repo, tmp_path_factory):
    """Two win_amd64 wheels of the fake build, as the wheels stage makes them (before repair)."""
    out = tmp_path_factory.mktemp("windist") / CONFIG
    options = wheels.WheelOptions(out_dir=out, python_tags=("cp311", "cp312"), platform_tag="win_amd64",
                                  repo=win_repo, epoch=315532800)
    return wheels.build_wheels(fake_native, win_config, options)

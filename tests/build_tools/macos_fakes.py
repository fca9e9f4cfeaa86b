"""Fixtures and helpers of the macOS tests (imported by the conftest of each folder that uses them): a stand-in Metal native build made of fake Mach-O dylibs (the real
build's load commands: system frameworks, libc++, each other by @rpath, LC_RPATH @loader_path), its
wheels, and stand-ins for delocate-wheel's effect on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from build_tools.inputs.configs import load_matrix
from build_tools.stages.native.build import NativeBuild
from build_tools.stages.wheels import build as wheels
from build_tools.stages.wheels.inwheel import Entry, read_entries, write_wheel

from ..native.fake_binaries import macho_dylib
from ..native_fakes import fake_native_build, snapshot_sources

CONFIG = "metal"
SYSTEM = ("/usr/lib/libc++.1.dylib", "/usr/lib/libSystem.B.dylib")
METAL = ("/System/Library/Frameworks/Metal.framework/Versions/A/Metal",
         "/System/Library/Frameworks/Foundation.framework/Versions/A/Foundation")
LIBRARIES = {
    "libggml-base.0.dylib": SYSTEM,
    "libggml.0.dylib": (*SYSTEM, "@rpath/libggml-base.0.dylib"),
    "libggml-cpu-apple_m1.so": (*SYSTEM, "@rpath/libggml-base.0.dylib"),
    "libggml-metal.so": (*SYSTEM, *METAL, "@rpath/libggml-base.0.dylib"),
    "libllama.0.dylib": (*SYSTEM, "@rpath/libggml-base.0.dylib", "@rpath/libggml.0.dylib"),
}


def dylib(name: str, needed: tuple[str, ...], **kw) -> bytes:
    install = f"@rpath/{name}" if name.endswith(".dylib") else None
    return macho_dylib(list(needed), install_name=install, rpaths=kw.pop("rpaths", ["@loader_path"]), **kw)


def delocated(wheel: Path, out: Path, *, add: dict[str, bytes] | None = None, name: str | None = None) -> Path:
    """What delocate-wheel writes for ``wheel``: the same files (``add``: a copied library or a
    rewritten one), under ``name`` if it retagged the wheel."""
    entries = {e.name: e for e in read_entries(wheel)}
    dist_info = next(n.split("/")[0] for n in entries if n.split("/")[0].endswith(".dist-info"))
    for path, data in (add or {}).items():
        entries[path] = Entry(path, data)
    out.mkdir(parents=True, exist_ok=True)
    return write_wheel(out / (name or wheel.name), entries.values(), dist_info, 315532800)


@pytest.fixture(scope="session")
def mac_config():
    return load_matrix().get(CONFIG)


@pytest.fixture(scope="session")
def mac_repo(tmp_path_factory) -> Path:
    """A snapshot of the package sources (the working tree may change while the tests run)."""
    root = tmp_path_factory.mktemp("macrepo")
    return snapshot_sources(root)


@pytest.fixture(scope="session")
def mac_native(mac_config, tmp_path_factory) -> NativeBuild:
    root = tmp_path_factory.mktemp("macnative") / f"{CONFIG}-fake"
    libraries = {name: dylib(name, needed) for name, needed in LIBRARIES.items()}
    return fake_native_build(root, mac_config, libraries, ("cpu-apple_m1", "metal"))


@pytest.fixture()
def mac_wheels(mac_native, mac_config, mac_repo, tmp_path):
    """Two macosx_14_0_arm64 wheels of the fake build, as the wheels stage makes them (before repair)."""
    options = wheels.WheelOptions(out_dir=tmp_path / CONFIG, python_tags=("cp311", "cp312"),
                                  platform_tag="macosx_14_0_arm64", repo=mac_repo, epoch=315532800)
    return wheels.build_wheels(mac_native, mac_config, options)

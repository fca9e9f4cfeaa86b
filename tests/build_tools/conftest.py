"""Shared fixtures of the build_tools tests: one set of repaired cpu-host wheels per session, a snapshot of
the sources, the smoke interpreter (each stage's folder adds its platform stand-ins in its own conftest)."""

from __future__ import annotations

import hashlib
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from build_tools.common import interpreters
from build_tools.inputs.configs import load_matrix
from build_tools.stages import wheels as stage_wheels
from build_tools.stages.native.build import NativeBuild
from build_tools.stages.native.manifest import LibraryRecord, NativeManifest
from build_tools.stages.wheels import build as wheels

from ..native_fakes import snapshot_sources


@pytest.fixture(scope="session")
def config(native_build):
    return load_matrix().get(native_build.config.name)


@pytest.fixture(scope="session")
def repo(tmp_path_factory) -> Path:
    """A snapshot of the package sources, so that wheels built during the session stay comparable
    even while the working tree is being edited."""
    root = tmp_path_factory.mktemp("repo")
    return snapshot_sources(root)


@pytest.fixture(scope="session")
def built(native_build, config, repo, tmp_path_factory):
    """The five cpu-host wheels, repaired (auditwheel) as a release makes them; treat as read-only."""
    out = tmp_path_factory.mktemp("dist") / config.name
    return stage_wheels.run(native_build, config, wheels.WheelOptions(out_dir=out, repo=repo))


@pytest.fixture
def wheel_copy(built, tmp_path):
    """Copy one wheel into a private folder for tampering; returns (BuiltWheel of the copy, all copies)."""
    copies = []
    for w in built.wheels:
        dst = tmp_path / w.path.name
        shutil.copyfile(w.path, dst)
        copies.append(replace(w, path=dst))
    return copies


@pytest.fixture(scope="session")
def smoke_interpreter():
    """The interpreter the default run smoke-tests on: this one's version if found, else the first found."""
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    found = [i for i in interpreters.find_all() if i.found]
    if not found:
        pytest.skip("no CPython 3.10-3.14 interpreter with venv found")
    return next((i for i in found if i.version == mine), found[0])


def fake_native(tmp: Path, config) -> NativeBuild:
    """A tiny stand-in native build (non-ELF library files) for configurations not built here (CUDA)."""
    root = tmp / f"{config.name}-fake"
    (root / "lib").mkdir(parents=True)
    libs = []
    for name in ("libggml-base.so.0", "libggml.so.0", "libllama.so.0", "libggml-cpu.so", "libggml-cuda.so"):
        data = f"fake {name}\n".encode() * 64
        (root / "lib" / name).write_bytes(data)
        libs.append(LibraryRecord(f"lib/{name}", hashlib.sha256(data).hexdigest(), len(data),
                                  soname=name, needed=("libc.so.6",) + (("libcudart.so.13", "libcuda.so.1")
                                                                         if "cuda" in name else ())))
    manifest = NativeManifest(
        config=config.to_json(), key="f" * 64, key_inputs={}, source={"commit": "0" * 40, "build_number": 1},
        toolchain={"versions": {"cc": "fake"}}, cmake={"configure": [], "build": []}, libraries=tuple(libs),
        backends=("cpu", "cuda"),
    )
    manifest.write(root)
    return NativeBuild(config, manifest.key, root, manifest, reused=True)

"""Configurations built natively on Windows and macOS: the ``platform`` key, the metal backend, what
they change in the build (defines, key, wheel tag, staging, smoke) and what they leave alone."""

from __future__ import annotations

import copy
import dataclasses
import sys
from types import SimpleNamespace

import pytest

from build_tools.common.paths import CONFIGS_FILE
from build_tools.errors import ConfigError, NativeBuildError
from build_tools.inputs.configs import PLATFORMS, load_matrix, parse_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages.native import build as native
from build_tools.stages.native.manifest import LibraryRecord
from build_tools.stages.smoke import target as smoke_target
from build_tools.stages.smoke.runner import STAGES
from build_tools.stages.wheels import build as wheels
from tests.native.fake_binaries import macho_dylib

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

NEW = {"cpu-windows-msvc": ("Windows", "x86_64"), "cuda-13.0-windows": ("Windows", "x86_64"),
       "cuda-12.8-windows": ("Windows", "x86_64"), "metal": ("Darwin", "arm64")}


@pytest.fixture()
def raw() -> dict:
    return tomllib.loads(CONFIGS_FILE.read_text())


def _first(raw: dict, name: str) -> dict:
    return next(c for c in raw["config"] if c["name"] == name)


def test_windows_and_macos_release_configurations():
    m = load_matrix()
    for name, where in NEW.items():
        c = m.get(name)
        assert c.cross is None and c.target == where, name
        assert c.release, name  # Windows CUDA too: cuda_toolkit.py provisions the Windows layout
    win, metal = m.get("cpu-windows-msvc"), m.get("metal")
    assert win.variant == "cpu" and win.local_version is None and win.cpu_variants == "all"
    assert metal.backend == "metal" and metal.variant == "cpu" and metal.local_version is None
    for cuda in ("cuda-13.0", "cuda-12.8"):  # same variant, index and architectures as the Linux build
        lin, w = m.get(cuda), m.get(f"{cuda}-windows")
        assert (w.variant, w.local_version, w.cuda.architectures, w.cuda.runtime_requires) == \
            (lin.variant, lin.local_version, lin.cuda.architectures, lin.cuda.runtime_requires)
    assert m.get("cuda-13.0-windows").cuda.toolkit == "pypi"  # NVIDIA's CUDA 13 wheels carry nvcc.exe
    assert m.get("cuda-12.8-windows").cuda.toolkit == "system"
    assert m.get("cpu").target == ("Linux", "x86_64") and m.get("cpu-aarch64").target == ("Linux", "aarch64")


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda d: _first(d, "metal").update(platform="macos-x86_64"), "platform: 'macos-x86_64' is not one of"),
    (lambda d: _first(d, "metal").update(platform=14), "platform: expected str"),
    (lambda d: _first(d, "cpu-windows-msvc").update(cross=dict(_first(d, "cpu-windows")["cross"])),
     "a cross build names its target in [config.cross]"),
    (lambda d: _first(d, "metal").pop("platform"), "'metal' needs platform = \"macos-arm64\""),
    (lambda d: _first(d, "metal").update(backend="cpu"), "a macOS configuration is backend = 'metal'"),
    (lambda d: _first(d, "vulkan").update(platform="windows-x86_64"), "Vulkan toolchain is provisioned on Linux"),
    (lambda d: _first(d, "metal").update(cmake={"GGML_METAL_EMBED_LIBRARY": False}), "cmake.GGML_METAL_EMBED_LIBRARY"),
    (lambda d: _first(d, "metal").update(cmake={"CMAKE_OSX_DEPLOYMENT_TARGET": "13.3"}),
     "cmake.CMAKE_OSX_DEPLOYMENT_TARGET"),
    (lambda d: _first(d, "cpu").update(backend="metal"), "'metal' needs platform"),
])
def test_bad_platform_names_the_key(raw, mutate, needle):
    data = copy.deepcopy(raw)
    mutate(data)
    with pytest.raises(ConfigError) as info:
        parse_matrix(data)
    assert needle in str(info.value)


def _key_inputs(config) -> dict:
    tree = SimpleNamespace(tree_sha256="0" * 64)
    toolchain = SimpleNamespace()
    return native.BuildPlan(config, tree, native.cmake_defines(config, load_lock()), toolchain,  # type: ignore[arg-type]
                            {"cc": "cc 1"}, {}, {}).key_inputs


def test_the_key_names_the_platform_only_where_it_is_set():
    m = load_matrix()
    for c in m.configs.values():
        assert ("platform" in c.to_json()) == (c.platform is not None), c.name
        assert ("platform" in _key_inputs(c)) == (c.platform is not None), c.name
    assert _key_inputs(m.get("cpu-windows-msvc"))["platform"] == "windows-x86_64"
    # same defines as the Linux cpu build, another key: the platform is in it
    win, cpu = m.get("cpu-windows-msvc"), m.get("cpu")
    assert native.cmake_defines(win, load_lock()) == native.cmake_defines(cpu, load_lock())
    assert native.BuildPlan(win, SimpleNamespace(tree_sha256="0"), {}, SimpleNamespace(), {}, {}, {}).key != \
        native.BuildPlan(cpu, SimpleNamespace(tree_sha256="0"), {}, SimpleNamespace(), {}, {}, {}).key


def test_metal_defines():
    m, lock = load_matrix(), load_lock()
    d = native.cmake_defines(m.get("metal"), lock)
    assert d["GGML_METAL"] == "ON" and d["GGML_METAL_EMBED_LIBRARY"] == "ON" and d["GGML_CUDA"] == "OFF"
    assert d["CMAKE_OSX_ARCHITECTURES"] == "arm64" and d["CMAKE_OSX_DEPLOYMENT_TARGET"] == "14.0"
    assert d["CMAKE_INSTALL_RPATH"] == "@loader_path" and d["GGML_CPU_ALL_VARIANTS"] == "ON"
    for c in m.configs.values():  # nothing of it reaches the other configurations (their keys stay)
        if c.backend != "metal":
            other = native.cmake_defines(c, lock)
            assert not {k for k in other if "METAL" in k or k.startswith("CMAKE_OSX")}, c.name
            assert other["CMAKE_INSTALL_RPATH"] == "$ORIGIN", c.name


def test_wheel_tags_follow_the_platform():
    m = load_matrix()
    host = wheels.default_platform_tag()
    assert wheels.target_platform_tag(m.get("metal"), host) == "macosx_14_0_arm64"
    assert wheels.target_platform_tag(m.get("cuda-13.0-windows"), host) == "win_amd64"
    assert wheels.target_platform_tag(m.get("cpu"), "linux_x86_64") == "linux_x86_64"
    with pytest.raises(ConfigError, match="does not match metal's platform macos-arm64"):
        wheels.target_platform_tag(m.get("metal"), "win_amd64" if host != "win_amd64" else "linux_x86_64")


def test_a_deployment_target_with_a_minor_version_is_refused(monkeypatch):
    monkeypatch.setattr(native, "MACOS_DEPLOYMENT_TARGET", "13.3")
    with pytest.raises(ConfigError, match="13.3 is not X.0"):
        wheels.target_platform_tag(load_matrix().get("metal"), wheels.default_platform_tag())


def test_metal_smoke_runs_the_release_stages_with_no_metal_device():
    t = smoke_target.target_for(load_matrix().get("metal"), install=False)
    assert t.stages == tuple(STAGES) and not t.require_gpu and not t.sandboxes
    assert t.env == {"GGML_METAL_DEVICES": "0"} and "GGML_METAL_DEVICES=0" in t.device


def test_dylibs_are_staged_under_their_install_names(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "libllama.0.0.11312.dylib").write_bytes(macho_dylib([], install_name="@rpath/libllama.0.dylib"))
    (bin_dir / "libllama.dylib").symlink_to("libllama.0.0.11312.dylib")
    (bin_dir / "libggml-metal.so").write_bytes(macho_dylib(["@rpath/libggml-base.0.dylib"]))  # a module: no id
    assert native._stage_libraries(bin_dir, tmp_path / "lib") == ["libggml-metal.so", "libllama.0.dylib"]
    (bin_dir / "libbad.dylib").write_bytes(b"not mach-o at all")
    with pytest.raises(NativeBuildError, match="libbad.dylib: not a readable Mach-O library"):
        native._stage_libraries(bin_dir, tmp_path / "lib2")


def test_runpath_check_takes_the_platform_s_origin():
    lib = LibraryRecord("lib/libllama.0.dylib", "0" * 64, 1, runpath=("@loader_path",))
    native._check_runpath((lib,), "@loader_path")
    with pytest.raises(NativeBuildError, match="expected only \\$ORIGIN"):
        native._check_runpath((lib,))
    leaked = dataclasses.replace(lib, runpath=("@loader_path", "/Users/runner/build/bin"))
    with pytest.raises(NativeBuildError, match="expected only @loader_path"):
        native._check_runpath((leaked,), "@loader_path")


def test_every_platform_has_a_wheel_tag():
    m = load_matrix()
    for name, where in PLATFORMS.items():
        config = next(c for c in m.configs.values() if c.platform == name)
        assert wheels.target_platform_tag(config, wheels.default_platform_tag()), where

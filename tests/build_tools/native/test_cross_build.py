"""The aarch64 cross configuration: strict [config.cross] parsing, the generated CMake toolchain
file, the compiler probe that refuses a GCC without SME before a long build, and the content key."""

from __future__ import annotations

import copy
import dataclasses
import shutil
import stat
import sys
from pathlib import Path

import pytest

from build_tools.common.compilers import detect
from build_tools.common.paths import CONFIGS_FILE
from build_tools.errors import ConfigError, ToolNotFoundError
from build_tools.inputs.configs import CrossSpec, load_matrix, parse_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages.native import build as native
from build_tools.stages.native import cross_toolchain

from ...syspkgs import require_cross
from .fake_tree import make_fake_tree

pytestmark = pytest.mark.aarch64

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

SPEC = CrossSpec(triple="aarch64-linux-gnu", system_processor="aarch64", apt=("g++-aarch64-linux-gnu",))


@pytest.fixture()
def raw() -> dict:
    return tomllib.loads(CONFIGS_FILE.read_text())


def _first(raw: dict, name: str) -> dict:
    return next(c for c in raw["config"] if c["name"] == name)


def test_committed_aarch64_configurations():
    m = load_matrix()
    full, dev = m.get("cpu-aarch64"), m.get("cpu-aarch64-dev")
    assert full.cross is not None and full.cross.triple == "aarch64-linux-gnu"
    assert full.cross.system_processor == "aarch64" and "libc6-dev-arm64-cross" in full.cross.apt
    assert full.cpu_variants == "all" and dev.cpu_variants == "single"
    # Every variant needs a compiler that knows armv9.2-a+sme: clang; the one-backend dev build keeps GCC.
    assert full.cross.compiler.startswith("clang-") and full.cross.compiler in full.cross.apt
    assert dev.cross.compiler == "gcc" and dev.cross.triple == full.cross.triple
    assert full.to_json()["cross"]["triple"] == "aarch64-linux-gnu"
    assert "compiler" not in dev.to_json()["cross"]  # gcc, the default: the dev build's key is as before
    assert "cross" not in m.get("cpu").to_json()  # the x86-64 configurations are unchanged


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: _first(d, "cpu-aarch64")["cross"].update(triple="aarch64 linux"), "not a GNU target triple"),
        (lambda d: _first(d, "cpu-aarch64")["cross"].update(system_processor="arm64"), "system_processor"),
        (lambda d: _first(d, "cpu-aarch64")["cross"].update(system_name="Darwin"), "system_name"),
        (lambda d: _first(d, "cpu-aarch64")["cross"].update(apt=[], dnf=[]), "aarch64-linux-gnu-gcc"),
        (lambda d: _first(d, "cpu-aarch64")["cross"].update(apt=["gcc; true"]), "is not a package name"),
        (lambda d: _first(d, "cpu-aarch64")["cross"].update(sysroot="/"), "unknown key 'sysroot'"),
        (lambda d: _first(d, "cpu-aarch64")["cross"].update(compiler="icc"), "is not 'gcc', 'clang' or 'clang-N'"),
        (lambda d: _first(d, "cpu-aarch64")["cross"].update(compiler="clang-19; rm"), "compiler"),
        (lambda d: _first(d, "cpu-aarch64")["cross"].pop("triple"), "missing required key 'triple'"),
        (lambda d: _first(d, "cpu-aarch64").update(cmake={"CMAKE_TOOLCHAIN_FILE": "x"}), "set by the recipe"),
        (lambda d: _first(d, "cuda-13.0").update(cross=_first(d, "cpu-aarch64")["cross"]), "not cross-compiled"),
    ],
)
def test_bad_cross_table_names_the_key(raw, mutate, needle):
    data = copy.deepcopy(raw)
    mutate(data)
    with pytest.raises(ConfigError) as info:
        parse_matrix(data)
    assert needle in str(info.value)


def test_toolchain_file_names_target_compilers_and_sysroot():
    text = cross_toolchain.toolchain_file_text(SPEC, Path("/usr/bin/aarch64-linux-gnu-gcc"),
                                               Path("/usr/bin/aarch64-linux-gnu-g++"))
    lines = text.splitlines()
    assert "set(CMAKE_SYSTEM_NAME Linux)" in lines and "set(CMAKE_SYSTEM_PROCESSOR aarch64)" in lines
    assert 'set(CMAKE_CXX_COMPILER "/usr/bin/aarch64-linux-gnu-g++")' in lines
    assert 'set(CMAKE_FIND_ROOT_PATH "/usr/aarch64-linux-gnu")' in lines
    assert "set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)" in lines  # host git stays findable
    assert "set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)" in lines


def test_clang_toolchain_file_sets_the_target_triple():
    spec = dataclasses.replace(SPEC, compiler="clang-19")
    assert cross_toolchain.compiler_names(spec) == ("clang-19", "clang++-19")
    assert cross_toolchain.compiler_names(SPEC) == ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++")
    lines = cross_toolchain.toolchain_file_text(spec, Path("/usr/bin/clang-19"), Path("/usr/bin/clang++-19")).splitlines()
    assert "set(CMAKE_C_COMPILER_TARGET aarch64-linux-gnu)" in lines
    assert "set(CMAKE_CXX_COMPILER_TARGET aarch64-linux-gnu)" in lines
    gcc_text = cross_toolchain.toolchain_file_text(SPEC, Path("/a-gcc"), Path("/a-g++"))
    assert "COMPILER_TARGET" not in gcc_text


def _fake_gcc(tmp_path: Path, accepts_sme: bool, needs_target: bool = False) -> Path:
    exe = tmp_path / "aarch64-linux-gnu-gcc"
    refuse = "" if accepts_sme else 'case "$*" in *+sme*) echo "unknown value for -march" >&2; exit 1;; esac\n'
    if needs_target:  # clang: without --target it compiles for the host, which has no armv9.2-a
        refuse += 'case "$*" in *--target=aarch64-linux-gnu*) ;; *) exit 1;; esac\n'
    exe.write_text(f"#!/bin/sh\n{refuse}exit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_probe_refuses_a_compiler_without_sme_naming_the_fix(tmp_path):
    with pytest.raises(ToolNotFoundError) as info:
        cross_toolchain.check_all_variants(SPEC, _fake_gcc(tmp_path, accepts_sme=False))
    msg = str(info.value)
    assert "+sme" in msg and "GCC >= 14" in msg and 'cpu_variants = "single"' in msg and "clang-19" in msg


def test_probe_drives_clang_with_the_target(tmp_path):
    cross_toolchain.check_all_variants(dataclasses.replace(SPEC, compiler="clang-19"),
                                       _fake_gcc(tmp_path, accepts_sme=True, needs_target=True))
    with pytest.raises(ToolNotFoundError):
        cross_toolchain.check_all_variants(SPEC, _fake_gcc(tmp_path, accepts_sme=True, needs_target=True))


def test_real_clang_accepts_every_variant():
    require_cross("cpu-aarch64")
    full = load_matrix().get("cpu-aarch64").cross
    cross_toolchain.check_all_variants(full, Path(shutil.which(cross_toolchain.compiler_names(full)[0])))


def test_probe_accepts_a_compiler_with_sme(tmp_path):
    cross_toolchain.check_all_variants(SPEC, _fake_gcc(tmp_path, accepts_sme=True))


def test_cross_plan_keys_on_the_cross_compiler(tmp_path, monkeypatch):
    require_cross("cpu-aarch64-dev")
    monkeypatch.setenv("LLAMA_CPP_PYTHON_CACHE", str(tmp_path / "cache"))
    tree, host = make_fake_tree(tmp_path / "tree"), detect()
    dev = load_matrix().get("cpu-aarch64-dev")
    p = native.plan(dev, load_lock(), tree, host, install=False)
    assert p.toolchain_versions["cross"] == "aarch64-linux-gnu" and p.toolchain_versions["machine"] == "aarch64"
    assert "aarch64-linux-gnu-gcc" in p.toolchain_versions["cc"] and "libc" not in p.toolchain_versions
    assert p.toolchain_versions["apt:libc6-dev-arm64-cross"]
    toolchain_file = Path(p.extra_defines["CMAKE_TOOLCHAIN_FILE"])
    assert toolchain_file.is_file() and "CMAKE_SYSTEM_PROCESSOR aarch64" in toolchain_file.read_text()
    # Paths are not in the key: another cache root (another toolchain file path) gives the same key.
    monkeypatch.setenv("LLAMA_CPP_PYTHON_CACHE", str(tmp_path / "elsewhere"))
    assert native.plan(dev, load_lock(), tree, host, install=False).key == p.key
    # The host's x86-64 build of the same tree is another key.
    assert native.plan(load_matrix().get("cpu-host"), load_lock(), tree, host).key != p.key
    newer = dataclasses.replace(p, toolchain_versions={**p.toolchain_versions, "apt:libc6-dev-arm64-cross": "9"})
    assert newer.key != p.key


def test_cpu_keys_unchanged_by_the_cross_support():
    # The cpu/cpu-host defines carry nothing of the cross support (their cached builds stay valid).
    lock = load_lock()
    for name in ("cpu", "cpu-host", "vulkan"):
        d = native.cmake_defines(load_matrix().get(name), lock)
        assert not any(k.startswith(("CMAKE_TOOLCHAIN", "CMAKE_SYSTEM")) for k in d)


def test_cross_wheels_are_tagged_for_the_target():
    from build_tools.stages.wheels.build import default_platform_tag, target_platform_tag

    m = load_matrix()
    host = default_platform_tag()
    assert target_platform_tag(m.get("cpu"), host) == host  # the host configurations keep the host's tag
    assert target_platform_tag(m.get("cpu-aarch64"), host) == "linux_aarch64"
    assert target_platform_tag(m.get("cpu-aarch64"), "linux_aarch64") == "linux_aarch64"
    with pytest.raises(ConfigError, match="does not match cpu-aarch64's cross target"):
        target_platform_tag(m.get("cpu-aarch64"), "win_amd64")


def test_a_machine_of_the_target_builds_natively():
    assert SPEC.is_native("aarch64", "Linux") and SPEC.is_native("arm64", "Linux")
    assert not SPEC.is_native("x86_64", "Linux") and not SPEC.is_native("aarch64", "Darwin")

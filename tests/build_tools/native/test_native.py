"""Content keys, cache hits, manifests and interrupted builds, on a tiny fake tree (seconds, not minutes)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from build_tools.common.compilers import detect
from build_tools.errors import NativeBuildError
from build_tools.inputs.configs import load_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages.native import build as native
from build_tools.stages.native.manifest import MANIFEST_NAME, load_manifest

from .fake_tree import make_fake_tree

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def toolchain():
    return detect()


def _plan(tree, toolchain, config_name="cpu-host", **config_changes):
    config = load_matrix().get(config_name)
    if config_changes:
        config = dataclasses.replace(config, **config_changes)
    return native.plan(config, load_lock(), tree, toolchain)


def test_key_is_stable_and_sensitive(tmp_path, toolchain):
    tree = make_fake_tree(tmp_path / "a")
    base = _plan(tree, toolchain).key
    assert _plan(tree, toolchain).key == base  # same inputs, same key
    other_tree = make_fake_tree(tmp_path / "b", flavour="b")
    assert _plan(other_tree, toolchain).key != base  # source changed
    assert _plan(tree, toolchain, cmake=(("GGML_OPENMP", "ON"),)).key != base  # CMake arguments changed
    assert _plan(tree, toolchain, config_name="cpu").key != base  # another configuration
    newer = dataclasses.replace(toolchain, versions={**toolchain.versions, "cc": "cc 99.0"})
    assert _plan(tree, newer).key != base  # compiler changed
    p = _plan(tree, toolchain)
    assert dataclasses.replace(p, toolchain_versions={**p.toolchain_versions, "cmake": "cmake 9"}).key != base
    # Paths are not part of the key: the same tree elsewhere gives the same key.
    moved = dataclasses.replace(tree, path=tmp_path / "elsewhere")
    assert _plan(moved, toolchain).key == base


def test_recipe_version_is_part_of_the_key(tmp_path, toolchain, monkeypatch):
    p = _plan(make_fake_tree(tmp_path / "a"), toolchain)
    before = p.key
    monkeypatch.setattr(native, "RECIPE_VERSION", "999")
    assert p.key != before


def test_build_then_cache_hit_without_compiler(empty_cache, tmp_path, toolchain, monkeypatch):
    p = _plan(make_fake_tree(tmp_path / "src"), toolchain)
    first = native.build(p)
    assert not first.reused
    names = sorted(lib.name for lib in first.manifest.libraries)
    assert names == ["libggml-base.so.0", "libggml-cpu.so", "libllama-common.so.0", "libllama-cpp-ext.so",
                     "libllama.so.0", "libmtmd.so.0"]
    assert first.manifest.backends == ("cpu",)
    llama = first.manifest.library("libllama.so.0")
    assert llama.soname == "libllama.so.0" and llama.runpath == ("$ORIGIN",) and "libggml-base.so.0" in llama.needed
    assert not any(f.is_symlink() for f in first.lib_dir.iterdir())
    assert (first.root / "build.log").is_file()

    def no_compiler(*a, **k):
        raise AssertionError("a compiler ran on a cache hit")

    monkeypatch.setattr(native.subprocess, "Popen", no_compiler)
    second = native.build(p)
    assert second.reused and second.root == first.root and second.manifest == first.manifest


def test_manifest_round_trip_and_tamper_detection(empty_cache, tmp_path, toolchain):
    nb = native.build(_plan(make_fake_tree(tmp_path / "src"), toolchain))
    loaded = load_manifest(nb.root)
    assert loaded == nb.manifest
    assert loaded.to_json() == load_manifest(nb.root / MANIFEST_NAME).to_json()
    assert native.verify(nb.root) == []

    lib = nb.lib_dir / "libllama.so.0"
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    (nb.lib_dir / "libextra.so").write_bytes(b"\x7fELF")
    (nb.lib_dir / "libmtmd.so.0").unlink()
    problems = native.verify(nb.root)
    assert any(p.startswith("lib/libllama.so.0: sha256") for p in problems)
    assert "lib/libmtmd.so.0: missing" in problems
    assert "lib/libextra.so: not in the manifest" in problems


def test_failed_build_leaves_nothing(empty_cache, tmp_path, toolchain):
    tree = make_fake_tree(tmp_path / "src")
    (tree.path / "llama.c").write_text("this is not C\n")
    p = _plan(dataclasses.replace(tree, tree_sha256="f" * 64), toolchain)
    with pytest.raises(NativeBuildError, match="failed with exit code"):
        native.build(p)
    assert native.find_finished(p) is None
    assert not list((empty_cache / "native").glob(f"*{p.dir_name}*.tmp-*"))
    assert not (empty_cache / "native" / p.dir_name).exists()


def test_interrupted_build_is_not_reused(empty_cache, tmp_path, toolchain):
    """A build killed mid-way (no chance to clean up) leaves no result a later run would take."""
    src = tmp_path / "src"
    make_fake_tree(src)
    script = textwrap.dedent(
        f"""
        import sys, logging
        sys.path.insert(0, {str(REPO)!r})
        from build_tools.stages.native import build as native
        from build_tools.inputs.configs import load_matrix
        from build_tools.inputs.lock import load_lock
        from tests.build_tools.native.fake_tree import make_fake_tree
        p = native.plan(load_matrix().get("cpu-host"), load_lock(), make_fake_tree(__import__("pathlib").Path({str(src)!r})))
        print(p.dir_name, flush=True)
        native.build(p)
        """
    )
    env = {**os.environ, "FAKE_SLOW_BUILD": "1"}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    dir_name = proc.stdout.readline().strip()
    deadline = time.monotonic() + 60
    native_dir = empty_cache / "native"
    while not list(native_dir.glob(f".{dir_name}.tmp-*/build.log")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(native_dir.glob(f".{dir_name}.tmp-*")), "the killed build should have left its staging dir"

    p = _plan(make_fake_tree(src), toolchain)
    assert p.dir_name == dir_name
    assert native.find_finished(p) is None  # the remains are not a finished build
    nb = native.build(p)  # completes now (the slow step is gone without FAKE_SLOW_BUILD)
    assert not nb.reused and native.verify(nb.root) == []
    assert not list(native_dir.glob(f".{dir_name}.tmp-*"))  # stale staging removed


def test_cli_verify_reports_the_changed_file(empty_cache, tmp_path, toolchain, monkeypatch, capsys):
    from build_tools.commands import native as native_cmd

    tree = make_fake_tree(tmp_path / "src")
    p = _plan(tree, toolchain)
    nb = native.build(p)
    monkeypatch.setattr(native_cmd, "current_tree", lambda lock: tree)
    monkeypatch.setattr(native, "detect", lambda: toolchain)
    from build_tools.cli import main

    assert main(["native", "--verify", "cpu-host"]) == 0
    assert "cpu-host: OK" in capsys.readouterr().out
    lib = nb.lib_dir / "libggml-cpu.so"
    data = bytearray(lib.read_bytes())
    data[100] ^= 0x01  # one byte
    lib.write_bytes(bytes(data))
    assert main(["native", "--verify", "cpu-host"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "lib/libggml-cpu.so: sha256" in out


def test_same_key_gives_same_bytes_in_any_location(tmp_path, toolchain, monkeypatch):
    """Paths stay out of the binaries: two clones in different folders build identical libraries."""
    results = []
    for where in ("one", "elsewhere/two"):
        monkeypatch.setenv("LLAMA_CPP_PYTHON_CACHE", str(tmp_path / where / "cache"))
        nb = native.build(_plan(make_fake_tree(tmp_path / where / "src"), toolchain))
        results.append(nb)
    a, b = results
    assert a.key == b.key and a.root != b.root
    assert [(lib.name, lib.sha256) for lib in a.manifest.libraries] == \
        [(lib.name, lib.sha256) for lib in b.manifest.libraries]
    assert str(tmp_path).encode() not in (a.lib_dir / "libggml-base.so.0").read_bytes()


def test_the_chat_extension_is_in_the_key_but_not_in_the_cmake_tree(tmp_path, toolchain, monkeypatch):
    p = _plan(make_fake_tree(tmp_path / "a"), toolchain)
    assert p.key_inputs["extensions"] == {native.EXT_NAME: native.ext_sources_sha256()}
    changed = dataclasses.replace(p, ext_sha256="0" * 64)
    assert changed.key != p.key and changed.build_dir == p.build_dir  # only the shim recompiles
    assert p.extra_defines["CMAKE_PROJECT_llama.cpp_INCLUDE"].endswith("cmake/chat_shim/inject.cmake")
    other = _plan(make_fake_tree(tmp_path / "b", flavour="b"), toolchain)
    assert other.build_dir != p.build_dir  # llama.cpp's sources are in both
    # the sources' hash covers every file of the folder
    src = tmp_path / "shim"
    src.mkdir()
    (src / "x.cpp").write_text("a")
    before = native.ext_sources_sha256(src)
    (src / "x.cpp").write_text("b")
    assert native.ext_sources_sha256(src) != before


def test_a_new_extension_key_reuses_the_tree_without_reconfiguring(empty_cache, tmp_path, toolchain):
    p = _plan(make_fake_tree(tmp_path / "src"), toolchain)
    first = native.build(p)
    # the reference tools' libraries land in the shared tree; a later key must not package them
    subprocess.run(["cmake", "--build", str(p.build_dir), "--target", "llama-completion-impl"], check=True,
                   capture_output=True)
    changed = dataclasses.replace(p, ext_sha256="1" * 64)
    second = native.build(changed)
    assert second.root != first.root and not second.reused and changed.build_dir == p.build_dir
    log = (second.root / "build.log").read_text()
    assert " -S " not in log  # configured once, by the first key
    assert sorted(x.name for x in second.manifest.libraries) == sorted(x.name for x in first.manifest.libraries)
    assert not any("impl" in x.name for x in second.manifest.libraries)


def test_a_checkout_elsewhere_reuses_the_results_but_not_the_cmake_tree(tmp_path, toolchain):
    a = _plan(make_fake_tree(tmp_path / "a"), toolchain)
    b = _plan(make_fake_tree(tmp_path / "b"), toolchain)
    assert a.key == b.key  # the same sources: one result in the cache for both checkouts
    assert a.build_dir != b.build_dir  # CMake refuses a tree configured from other source paths

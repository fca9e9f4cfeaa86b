"""The native step's configure line on a Windows host (faked here).

ggml's CMakeLists asks git for the commit of the vendored tree, which has no .git, so the real git
would name this checkout's commit: the line names a .cmd stand-in that answers from the source lock,
as the shell one does. And paths go to CMake with forward slashes: it copies the compiler's path
into generated .cmake files, where ``C:\\Program Files`` would read as an escape sequence.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import PureWindowsPath

import pytest

from build_tools.common.compilers import Toolchain, detect
from build_tools.inputs.configs import load_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages.native import build as native

from .fake_tree import make_fake_tree
from .test_wine import _wine, _wineserver

pytestmark = pytest.mark.windows

# What llama.cpp's CMake files ask (ggml/CMakeLists.txt, cmake/build-info.cmake, cmake/git-vars.cmake,
# CMake's FindGit) and what the pinned answers are.
QUESTIONS = {
    ("rev-parse", "--short", "HEAD"): ("short", 0),
    ("rev-list", "--count", "HEAD"): ("build", 0),
    ("diff-index", "--quiet", "HEAD", "--", "."): ("", 0),
    ("describe", "--match=NeVeRmAtCh", "--always", "--abbrev=8"): ("short", 0),
    ("log", "-1", "--format=%ad", "--date=local"): ("", 1),
    ("--version",): ("", 1),
    ("rev-parse", "--short", "HEAD", "extra"): ("", 1),
}


@pytest.fixture
def plan(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_CPP_PYTHON_CACHE", str(tmp_path / "cache"))
    tree = make_fake_tree(tmp_path / "tree")
    return native.plan(load_matrix().get("cpu-host"), load_lock(), tree, detect())


def _git_defines(cmd: list[str]) -> dict[str, str]:
    defs = dict(a[2:].split("=", 1) for a in cmd if a.startswith("-D"))
    return {k: defs[k] for k in ("GIT_EXE", "GIT_EXECUTABLE") if k in defs}


def test_a_windows_configure_line_names_the_cmd_stand_in(plan, tmp_path, monkeypatch):
    monkeypatch.setattr(native, "_host_is_windows", lambda: True)
    git = _git_defines(native._configure_cmd(plan, tmp_path / "b"))
    assert set(git) == {"GIT_EXE", "GIT_EXECUTABLE"} and git["GIT_EXE"] == git["GIT_EXECUTABLE"]
    assert git["GIT_EXE"].endswith(".cmd")
    script = open(git["GIT_EXE"], "rb").read()
    lock = load_lock()
    assert script.startswith(b"@echo off\r\n") and b"\n" not in script.replace(b"\r\n", b"")
    assert f"echo {lock.short_commit}\r\n".encode() in script
    assert f"echo {lock.build_number}\r\n".encode() in script


def test_other_hosts_keep_the_shell_stand_in(plan, tmp_path, monkeypatch):
    monkeypatch.setattr(native, "_host_is_windows", lambda: False)
    git = _git_defines(native._configure_cmd(plan, tmp_path / "b"))["GIT_EXE"]
    assert not git.endswith(".cmd") and open(git).read().startswith("#!/bin/sh\n")
    lock = load_lock()
    for args, (answer, code) in QUESTIONS.items():
        done = subprocess.run([git, *args], capture_output=True, text=True, check=False)
        want = {"short": lock.short_commit, "build": str(lock.build_number), "": ""}[answer]
        assert (done.stdout.strip(), done.returncode) == (want, code), args


def test_the_cmd_stand_in_answers_like_git_under_wine(plan, tmp_path, monkeypatch):
    """cmd.exe's own reading of the .cmd file (Wine's cmd; on a runner CMake starts it through cmd.exe),
    by the forward-slash path CMake uses and by a backslash one. A private prefix: the shared one's
    wineserver belongs to test_wine.py."""
    wine = _wine()
    if wine is None:
        pytest.skip("Wine is not installed: apt-get install wine64")
    monkeypatch.setattr(native, "_host_is_windows", lambda: True)
    git = _git_defines(native._configure_cmd(plan, tmp_path / "b"))["GIT_EXE"]
    lock = load_lock()
    env = {**os.environ, "WINEPREFIX": str(tmp_path / "wineprefix"), "WINEDEBUG": "-all",
           "WINEDLLOVERRIDES": "mscoree,mshtml="}
    try:
        for windows_path in ("Z:" + git, "Z:" + git.replace("/", "\\")):  # Wine's Z: drive is /
            for args, (answer, code) in QUESTIONS.items():
                with tempfile.TemporaryFile() as out:  # a file: Wine's helpers may keep a pipe open
                    done = subprocess.run([wine, "cmd", "/c", windows_path, *args], stdin=subprocess.DEVNULL,
                                          stdout=out, stderr=subprocess.DEVNULL, env=env, timeout=300,
                                          check=False, start_new_session=True)
                    out.seek(0)
                    got = out.read().decode(errors="replace").strip()
                want = {"short": lock.short_commit, "build": str(lock.build_number), "": ""}[answer]
                assert (got, done.returncode) == (want, code), (windows_path, args)
    finally:
        server = _wineserver(wine)
        if server is not None:
            subprocess.run([server, "-k"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False, timeout=60)


def test_windows_paths_reach_cmake_with_forward_slashes(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_CPP_PYTHON_CACHE", str(tmp_path / "cache"))
    llvm = PureWindowsPath(r"C:\Program Files\LLVM\bin")
    scripts = PureWindowsPath(r"C:\hostedtoolcache\windows\Python\3.12.10\x64\Scripts")
    host = Toolchain(cmake=scripts / "cmake.exe", ninja=scripts / "ninja.exe", cc=llvm / "clang.exe",
                     cxx=llvm / "clang++.exe", versions={"cc": "clang version 20.1.8", "system": "Windows"})
    config = load_matrix().get("cpu-windows-msvc")
    p = native.plan(config, load_lock(), make_fake_tree(tmp_path / "tree"), host)
    monkeypatch.setattr(native, "_host_is_windows", lambda: True)
    defs = dict(a[2:].split("=", 1) for a in native._configure_cmd(p, tmp_path / "b") if a.startswith("-D"))
    assert defs["CMAKE_C_COMPILER"] == "C:/Program Files/LLVM/bin/clang.exe"
    assert defs["CMAKE_CXX_COMPILER"] == "C:/Program Files/LLVM/bin/clang++.exe"
    assert defs["CMAKE_MAKE_PROGRAM"] == scripts.as_posix() + "/ninja.exe"
    assert not any("\\" in v for k, v in defs.items() if k.startswith(("CMAKE_", "GIT_"))), defs


def test_linux_configure_lines_keep_their_paths(plan, tmp_path, monkeypatch):
    monkeypatch.setattr(native, "_host_is_windows", lambda: False)
    cmd = native._configure_cmd(plan, tmp_path / "b")
    assert f"-DCMAKE_C_COMPILER={plan.toolchain.cc}" in cmd and f"-DCMAKE_MAKE_PROGRAM={plan.toolchain.ninja}" in cmd

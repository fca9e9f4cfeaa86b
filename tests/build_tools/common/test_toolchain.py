"""Tool discovery: system CMake/Ninja when good enough, else the PyPI packages in the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from build_tools.common import compilers as toolchain
from build_tools.errors import ToolNotFoundError


def test_detect_records_versions():
    tc = toolchain.detect()
    for key in ("cmake", "ninja", "cc", "cxx", "machine"):
        assert tc.versions[key]
    assert tc.cmake.exists() and tc.ninja.exists()


def test_missing_ninja_comes_from_pypi(monkeypatch):
    calls = []
    monkeypatch.delenv("NINJA", raising=False)
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)
    monkeypatch.setattr(toolchain, "_from_pypi", lambda req, exe: calls.append((req, exe)) or Path("/x") / exe)
    assert toolchain.find_ninja() == Path("/x/ninja")
    assert calls == [(toolchain.PYPI_NINJA, "ninja")]


def test_old_cmake_is_replaced_from_pypi(monkeypatch, tmp_path):
    old = tmp_path / "cmake"
    old.write_text("#!/bin/sh\necho 'cmake version 3.10.2'\n")
    old.chmod(0o755)
    monkeypatch.setenv("CMAKE", str(old))
    monkeypatch.setattr(toolchain, "_from_pypi", lambda req, exe: Path("/pypi") / exe)
    assert toolchain.find_cmake() == Path("/pypi/cmake")


def test_missing_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler")
    with pytest.raises(ToolNotFoundError, match="no CC compiler found.*no-such-compiler"):
        toolchain.find_compiler("CC", ("cc",))

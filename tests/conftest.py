"""Shared fixtures: the ``cpu-host`` native build the tests run against.

The build comes from the content-keyed cache (``build_tools.stages.native``); in a fresh clone the
first test session builds it once (``nox -s tests`` does that before pytest starts).
``LLAMA_CPP_LIB_PATH`` points the package's loader at its libraries.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TEST_CONFIG = os.environ.get("LLAMA_CPP_TEST_CONFIG", "cpu-host")


def _native_build():
    from build_tools.inputs.configs import load_matrix
    from build_tools.inputs.lock import load_lock
    from build_tools.stages.native import build as native
    from build_tools.stages.vendor import current_tree

    lock = load_lock()
    p = native.plan(load_matrix().get(TEST_CONFIG), lock, current_tree(lock))
    nb = native.build(p)
    return nb, p


_NB = None


def native_build_and_plan():
    global _NB
    if _NB is None:
        _NB = _native_build()
    return _NB


UNIT = REPO / "tests" / "unit"


def _only_unit_tests(config: pytest.Config) -> bool:
    """Whether every path pytest was asked to collect lies in ``tests/unit`` (no compiler, no model)."""
    base = Path(config.invocation_params.dir)
    args = [a.split("::", 1)[0] for a in config.args if not a.startswith("-")]
    paths = [(base / a).resolve() for a in args] or [REPO / "tests"]
    return all(p == UNIT or UNIT in p.parents for p in paths)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "realmodel: needs a real small model from a PyPI package")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    # the platform a test checks (all run here, on stand-ins, cross builds or emulators): `pytest -m windows`
    config.addinivalue_line("markers", "windows: checks the Windows branch (MinGW/MSVC builds, PE DLLs, delvewheel, Wine)")
    config.addinivalue_line("markers", "macos: checks the macOS branch (Metal builds, Mach-O dylibs, delocate)")
    config.addinivalue_line("markers", "aarch64: checks the arm64 Linux branch (cross build, qemu-user userlands)")
    config.addinivalue_line("markers", "vulkan: checks the Vulkan backend and its toolchain (glslc, lavapipe)")
    if _only_unit_tests(config):
        return  # the unit tier needs no native build: `pytest tests/unit` runs without a compiler
    if "LLAMA_CPP_LIB_PATH" not in os.environ and (REPO / "vendor" / "llama.cpp" / "CMakeLists.txt").exists():
        nb, _ = native_build_and_plan()
        os.environ["LLAMA_CPP_LIB_PATH"] = str(nb.lib_dir)


@pytest.fixture(scope="session")
def native_build():
    """The finished ``cpu-host`` NativeBuild (cache hit after the first build)."""
    return native_build_and_plan()[0]


@pytest.fixture(scope="session")
def lib_dir(native_build) -> Path:
    return native_build.lib_dir


@pytest.fixture(scope="session")
def tools_dir(native_build) -> Path:
    """llama.cpp's own reference programs built from the same tree and configuration."""
    from build_tools.stages.native import build as native

    return native.build_reference_tools(native_build, native_build_and_plan()[1])


@pytest.fixture(scope="session")
def run_tool(tools_dir) -> Callable[..., subprocess.CompletedProcess]:
    """Run one of llama.cpp's reference programs; returns the CompletedProcess (stdout as bytes).

    The programs log through an asynchronous logger that upstream never joins at exit; a preloaded
    shim (``build_tools.stages.native.build.tool_env``) drains it. ``complete(stdout)`` still guards the output:
    a truncated run of these deterministic programs is repeated.
    """

    from build_tools.stages.native.build import tool_env

    env = tool_env(tools_dir)

    def run(name: str, *args: object, timeout: float = 120,
            complete: Callable[[bytes], bool] | None = None) -> subprocess.CompletedProcess:
        for _ in range(5):
            proc = subprocess.run([str(tools_dir / name), *map(str, args)], check=False, capture_output=True,
                                  timeout=timeout, env=env)
            if proc.returncode != 0:
                raise AssertionError(f"{name} failed ({proc.returncode}):\n"
                                     f"{proc.stderr.decode(errors='replace')[-3000:]}")
            if complete is None or complete(proc.stdout):
                return proc
        raise AssertionError(f"{name} kept printing truncated output: {proc.stdout[-200:]!r}")

    return run


@pytest.fixture()
def empty_cache(tmp_path, monkeypatch) -> Path:
    """An empty ``LLAMA_CPP_PYTHON_CACHE`` for the test (native builds, toolkits, downloads)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("LLAMA_CPP_PYTHON_CACHE", str(root))
    return root

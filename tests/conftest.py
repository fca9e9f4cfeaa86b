"""Shared fixtures: the ``cpu-host`` native build the tests run against.

The build comes from the content-keyed cache (``build_tools.native``); in a fresh clone the
first test session builds it once (``nox -s tests`` does that before pytest starts).
``LLAMA_CPP_LIB_PATH`` points the package's loader at its libraries.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TEST_CONFIG = os.environ.get("LLAMA_CPP_TEST_CONFIG", "cpu-host")


def _native_build():
    from build_tools import native
    from build_tools.configs import load_matrix
    from build_tools.lock import load_lock
    from build_tools.vendor import current_tree

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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "realmodel: needs a real small model from a PyPI package")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
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
    from build_tools import native

    return native.build_reference_tools(native_build, native_build_and_plan()[1])

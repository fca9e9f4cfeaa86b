"""Fixtures for the runtime tests: tiny generated models and llama.cpp's reference tools."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from build_tools.fixtures import fixture_path


@pytest.fixture(scope="session")
def spm_model() -> Path:
    return fixture_path("llama_spm")


@pytest.fixture(scope="session")
def bpe_model() -> Path:
    return fixture_path("llama_bpe")


@pytest.fixture(scope="session")
def embedding_model() -> Callable[..., Path]:
    return lambda **kw: fixture_path("embedding_model", **kw)

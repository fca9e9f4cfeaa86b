"""Fixtures for the compatibility tests: the tiny generated models (a transformer and a hybrid)."""

from __future__ import annotations

from pathlib import Path

import pytest

from build_tools.fixtures import fixture_path


@pytest.fixture(scope="session")
def spm_model() -> Path:
    return fixture_path("llama_spm")


@pytest.fixture(scope="session")
def hybrid_model() -> Path:
    """qwen35 with gated-delta-net layers: llama.cpp reports it as hybrid (is_hybrid)."""
    return fixture_path("qwen35_mtp", form="random")


@pytest.fixture(scope="session")
def recurrent_model() -> Path:
    """A tiny Mamba (recurrent memory only), the upstream-suite runner's stand-in."""
    standins = pytest.importorskip("build_tools.compat.standins")
    return standins.stand_in_path("QuantFactory/mamba-130m-hf-GGUF", "mamba-130m-hf.Q2_K.gguf")

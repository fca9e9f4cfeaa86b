"""Fixtures for the multimodal tests: the tiny text models paired with the synthetic projectors."""

from __future__ import annotations

from pathlib import Path

import pytest

from build_tools.fixtures import fixture_path, png_bytes


@pytest.fixture(scope="session")
def spm_model() -> Path:
    return fixture_path("llama_spm")


@pytest.fixture(scope="session")
def mmproj_vision() -> Path:
    return fixture_path("mmproj_vision")


@pytest.fixture(scope="session")
def mmproj_audio() -> Path:
    return fixture_path("mmproj_audio")


@pytest.fixture(scope="session")
def qwen35_random() -> Path:
    """qwen35 (M-RoPE, hybrid) with random weights: positions change its outputs."""
    return fixture_path("qwen35_mtp", form="random")


@pytest.fixture(scope="session")
def qwen35_echo() -> Path:
    return fixture_path("qwen35_mtp", form="echo")


@pytest.fixture(scope="session")
def png_path() -> Path:
    return fixture_path("png")


@pytest.fixture(scope="session")
def png2() -> bytes:
    return png_bytes(48, 40, seed=3)


@pytest.fixture(scope="session")
def wav_path() -> Path:
    return fixture_path("wav")


@pytest.fixture(scope="module")
def handler(spm_model, mmproj_vision):
    from llama_cpp.mtmd import MTMDEmbeddingHandler

    h = MTMDEmbeddingHandler(spm_model, mmproj_vision, n_ctx=2048, n_batch=512, n_seq_max=4, n_threads=1)
    yield h
    h.close()

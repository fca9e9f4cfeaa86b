"""Fixtures for the runtime tests: tiny generated models and llama.cpp's reference tools."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures import fixture_path


@pytest.fixture(scope="session")
def spm_model() -> Path:
    return fixture_path("llama_spm")


@pytest.fixture(scope="session")
def bpe_model() -> Path:
    return fixture_path("llama_bpe")


@pytest.fixture(scope="session")
def embedding_model() -> Callable[..., Path]:
    return lambda **kw: fixture_path("embedding_model", **kw)


@pytest.fixture(scope="session")
def run_tool(tools_dir) -> Callable[..., subprocess.CompletedProcess]:
    """Run one of llama.cpp's programs; returns the CompletedProcess (stdout as bytes)."""

    def run(name: str, *args: str, timeout: float = 120,
            complete: Callable[[bytes], bool] | None = None) -> subprocess.CompletedProcess:
        # llama.cpp's tools log through an asynchronous, deliberately leaked logger: the tail of
        # stdout can be lost at exit on a busy machine. ``complete`` says whether the output is
        # whole; a truncated run is repeated (deterministic programs, so the result is the same).
        for _ in range(5):
            proc = subprocess.run([str(tools_dir / name), *map(str, args)], check=False, capture_output=True,
                                  timeout=timeout)
            if proc.returncode != 0:
                raise AssertionError(f"{name} failed ({proc.returncode}):\n{proc.stderr.decode(errors='replace')[-3000:]}")
            if complete is None or complete(proc.stdout):
                return proc
        raise AssertionError(f"{name} kept printing truncated output: {proc.stdout[-200:]!r}")

    return run

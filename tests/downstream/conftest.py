"""Libraries built on llama-cpp-python, used as their docs show (``nox -s downstream``).

Each module skips when its library is not installed, so the regular suite skips them all. The
downstream session copies this folder next to an installed wheel (this package's, then upstream
0.3.36's), so nothing here imports the repository: the models come from
``$LLAMA_CPP_DOWNSTREAM_MODELS`` (a JSON file: ``spm``, ``bpe``, ``embed``, ``gemma`` or null), and
each test's outputs go through ``record(name, value)`` into ``$LLAMA_CPP_DOWNSTREAM_RECORD``, which
the session compares between the two packages. Run in the repository, the models come from the
fixture cache and nothing is recorded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest

_RECORDED: dict[str, Any] = {}


def _models() -> dict[str, str | None]:
    listed = os.environ.get("LLAMA_CPP_DOWNSTREAM_MODELS")
    if listed:
        with open(listed) as f:
            return json.load(f)
    from build_tools.fixtures import fixture_path  # in the repository: the fixture cache

    return {"spm": str(fixture_path("llama_spm")), "bpe": str(fixture_path("llama_bpe")),
            "embed": str(fixture_path("embedding_model", pooling="mean")), "gemma": None}


@pytest.fixture(scope="session")
def models() -> dict[str, str | None]:
    return _models()


@pytest.fixture(scope="session")
def spm_path(models) -> str:
    return str(models["spm"])


@pytest.fixture(scope="session")
def gemma_path(models) -> str:
    if not models.get("gemma"):
        pytest.skip("Gemma 3 270M is not installed (requirements/realmodels.txt)")
    return str(models["gemma"])


@pytest.fixture
def record(request) -> Callable[[str, Any], Any]:
    """``record(name, value)``: keep ``value`` (JSON data) under ``<test id>/<name>`` for the comparison
    with upstream; returns ``value``."""

    def rec(name: str, value: Any) -> Any:
        _RECORDED[f"{request.node.nodeid.split('::', 1)[-1]}/{name}"] = json.loads(json.dumps(value, default=str))
        return value

    return rec


def pytest_sessionfinish(session, exitstatus) -> None:
    out = os.environ.get("LLAMA_CPP_DOWNSTREAM_RECORD")
    if out:
        with open(out, "w") as f:
            json.dump(_RECORDED, f, indent=1, sort_keys=True)

"""Fixtures for the MTP speculative-decoding tests: the tiny qwen35 + NextN models and helpers.

Every context runs one thread: the fixtures are tiny, and on a shared 2-core machine a second
spinning thread makes each decode hundreds of times slower.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from build_tools.fixtures import fixture_path

from .util import FORMS


@pytest.fixture(scope="session")
def mtp_path() -> Callable[[str], Path]:
    return lambda form: fixture_path("qwen35_mtp", form=form)


@pytest.fixture(scope="session")
def mtp_models(mtp_path) -> Iterator[dict]:
    """One loaded model (with its NextN block) per fixture form."""
    from llama_cpp.speculative import load_mtp_model

    models = {form: load_mtp_model(mtp_path(form)) for form in FORMS}
    yield models
    for m in models.values():
        m.close()

"""Fixtures for the n-gram and draft-model speculative tests: target models, drafts, prompts.

Targets: ``llama_bpe`` (pure attention), ``qwen35_mtp`` ``echo`` and ``random`` (hybrid: one
recurrent and one attention layer, so rollbacks go through ``n_rs_seq`` snapshots or
checkpoints). Every context runs one thread (see tests/speculative/mtp/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from build_tools.fixtures import fixture_path

TARGETS = {"bpe": ("llama_bpe", {}), "echo": ("qwen35_mtp", {"form": "echo"}),
           "random": ("qwen35_mtp", {"form": "random"})}


@pytest.fixture(scope="session")
def target_path():
    return lambda name: fixture_path(TARGETS[name][0], **TARGETS[name][1])


@pytest.fixture(scope="session")
def targets(target_path) -> Iterator[dict]:
    """One loaded model per target name."""
    from llama_cpp._internals import LlamaModel

    models = {name: LlamaModel(target_path(name)) for name in TARGETS}
    yield models
    for m in models.values():
        m.close()


@pytest.fixture(scope="session")
def draft_path():
    return lambda form="echo", **kw: fixture_path("draft_model", form=form, **kw)


@pytest.fixture(scope="session")
def echo(targets):
    """The echo target (its NextN head and the draft fixtures agree with it by construction)."""
    return targets["echo"]


@pytest.fixture(scope="session")
def references(echo) -> dict:
    """Prompt -> (tokens, plain greedy continuation of N_GEN tokens) on the echo target
    (test_equivalence keeps its own, over every target)."""
    from .util import N_GEN, PROMPTS, plain_generate

    out = {}
    for p in PROMPTS:
        toks = echo.tokenize(p.encode(), add_special=True)
        out[p] = (toks, plain_generate(echo, toks, N_GEN))
    return out

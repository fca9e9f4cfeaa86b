"""Issue 29: SPM tokenization stays linear (exact chunks) on text of characters in no token."""

from __future__ import annotations

import random
import time

import pytest

from build_tools.fixtures.cache import fixture_path
from llama_cpp import Llama
from llama_cpp._safety import tokenize_bounds


@pytest.fixture(scope="module")
def spm():
    with Llama(str(fixture_path("llama_spm")), vocab_only=True, verbose=False) as llm:
        yield llm._model


@pytest.mark.parametrize("char", ["\n", "\u4e2d", "\U0001f600"])
def test_long_run_of_unknown_characters_is_linear(spm, char: str) -> None:
    small, big = (char * 100_000).encode(), (char * 400_000).encode()
    start = time.monotonic()
    spm.tokenize(small)
    t_small = time.monotonic() - start
    start = time.monotonic()
    n = len(spm.tokenize(big))
    t_big = time.monotonic() - start
    assert n >= 400_000
    assert t_big < max(8 * t_small, 1.5), (t_small, t_big)  # quadratic would be 16x


@pytest.mark.parametrize("seed", range(4))
def test_chunked_tokenization_equals_one_call(spm, seed: int) -> None:
    r = random.Random(seed)
    words = ["hello", " world", "\n", "\u4e2d\u6587", "\u00e9", "<|im_start|>", "<s>", "  ", "\u2581", "ab", "\U0001f642",
             "\t", "x", "</s>"]
    for _ in range(40):
        text = "".join(r.choice(words) for _ in range(r.randint(1, 400))).encode()
        for special in (False, True):
            for add in (False, True):
                one = spm._tokenize_once(text, add, special)
                chunked = tokenize_bounds.tokenize(spm, text, add, special, spm._tokenize_once, threshold=0,
                                                   chunk=r.randint(1, 40))
                assert chunked == one, text

"""Shared pieces of the downstream-library tests (LangChain, LlamaIndex) on the tiny fixtures.

Each test builds the library's own wrapper and an independent :class:`llama_cpp.Llama` with the
same construction keywords, then compares what the library returns with what the direct call
returns for the same parameters. The fixtures decode deterministically with greedy sampling, so
equal text means the library drove our API exactly as it drives upstream's.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

PROMPT = "Hello world"
N_CTX = 256
MAX_TOKENS = 16


def embedding_model(**params: Any) -> Path:
    """The BERT embedding fixture (mean pooling unless ``pooling=`` says otherwise)."""
    from build_tools.fixtures import fixture_path

    return fixture_path("embedding_model", **params)


@contextmanager
def obsolete_keywords_allowed() -> Iterator[None]:
    """Silence the DeprecationWarning for the keywords these libraries still pass (``f16_kv``, ...).

    Only that category is silenced: an unknown-keyword UserWarning still reaches pytest.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def reference_llama(path: Path | str, **kwargs: Any) -> Any:
    """A separate ``Llama`` over the same file, for the expected values."""
    from llama_cpp import Llama

    return Llama(model_path=str(path), verbose=False, **kwargs)


def completion_text(llama: Any, prompt: str, **params: Any) -> str:
    out = llama.create_completion(prompt, **params)
    text = out["choices"][0]["text"]
    assert isinstance(text, str)
    return text


def chat_text(llama: Any, messages: list[dict[str, Any]], **params: Any) -> str:
    out = llama.create_chat_completion(messages=messages, **params)
    content = out["choices"][0]["message"]["content"]
    assert isinstance(content, str)
    return content


def first_word_after(text: str, start: int = 1) -> str:
    """A word of ``text`` past its first one (a stop string that must cut the output short)."""
    words = text.split()
    assert len(words) > start, f"the fixture generated too few words to pick a stop string: {text!r}"
    return words[start]


def assert_rows_close(got: list[list[float]], want: Any, *, atol: float = 1e-5) -> None:
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    assert g.shape == w.shape, f"shape {g.shape} != {w.shape}"
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, w, rtol=0, atol=atol)

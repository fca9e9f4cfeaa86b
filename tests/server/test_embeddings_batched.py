"""Embedding and reranking requests of concurrent clients packed into shared decodes (``EmbeddingEngine``):
each client gets the vectors and scores it gets served one request at a time, to float rounding: llama.cpp's
CPU kernels sum in an order that depends on how many rows a decode has, so an input packed with others
differs from it alone by up to about 2e-5 here, as inputs of one request packed together always have."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import Llama
from llama_cpp.server.engine import Job, SerialEngine
from llama_cpp.server.engine.embeddings import EmbeddingEngine, EmbedRequest

from .conftest import THREADS
from .together import run_together

TEXTS = [["hello there", "the cat sat on the mat"], ["a dog ran"], ["cats and dogs", "x", "one more input here"],
         ["hello there"]]


@pytest.fixture(scope="module")
def srv(start_server, embed_path):
    rank = str(fixture_path("embedding_model", pooling="rank"))
    return start_server([
        {"model": str(embed_path), "model_alias": "embed", "embedding": True, "n_ctx": 256, "n_parallel": 4},
        {"model": str(embed_path), "model_alias": "embed-serial", "embedding": True, "n_ctx": 256, "n_parallel": 0},
        {"model": rank, "model_alias": "rank", "embedding": True, "n_ctx": 256, "n_parallel": 4},
        {"model": rank, "model_alias": "rank-serial", "embedding": True, "n_ctx": 256, "n_parallel": 0}])


def test_engines(srv):
    assert isinstance(srv.engine("embed"), EmbeddingEngine) and srv.engine("embed").n_slots == 4
    assert isinstance(srv.engine("embed-serial"), SerialEngine)
    assert not isinstance(srv.engine("embed-serial"), EmbeddingEngine)


def test_concurrent_embeddings_equal_one_at_a_time(srv):
    def embed(model: str, inputs: list[str]) -> dict:
        r = httpx.post(srv.url + "/v1/embeddings", json={"model": model, "input": inputs}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    want = [embed("embed-serial", t) for t in TEXTS]
    got = run_together(lambda t: embed("embed", t), TEXTS)
    for g, w in zip(got, want):
        assert len(g["data"]) == len(w["data"])
        for a, b in zip(g["data"], w["data"]):
            np.testing.assert_allclose(a["embedding"], b["embedding"], rtol=1e-4, atol=1e-4)
        assert g["usage"] == w["usage"]


def test_concurrent_reranks_equal_one_at_a_time(srv):
    queries = [("cat", ["the cat sat", "a dog ran"]), ("dog", ["a dog ran", "hello", "cats and dogs"]),
               ("hello", ["hello there"]), ("mat", ["the cat sat on the mat", "x"])]

    def rank(model: str, q) -> dict:
        r = httpx.post(srv.url + "/v1/rerank", json={"model": model, "query": q[0], "documents": q[1]}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    want = [rank("rank-serial", q) for q in queries]
    got = run_together(lambda q: rank("rank", q), queries)
    for g, w in zip(got, want):
        assert [x["index"] for x in g["results"]] == [x["index"] for x in w["results"]]
        np.testing.assert_allclose([x["relevance_score"] for x in g["results"]],
                                   [x["relevance_score"] for x in w["results"]], rtol=1e-4, atol=1e-4)


def test_waiting_requests_share_one_pass(embed_path):
    """Four requests queued while the engine is held run as one pass (one packed decode here)."""
    llama = Llama(str(embed_path), embedding=True, n_ctx=256, verbose=False, **THREADS)
    model = llama.native_model()
    lists = [[model.tokenize(t.encode(), add_special=True, parse_special=True) for t in ts] for ts in TEXTS]
    alone = []
    for ls in lists:
        from llama_cpp.llama_embedding import embed_token_lists

        alone.append(embed_token_lists(llama.native_context(), model, ls, normalize=-1, truncate=False)[0])
    n0 = llama.native_context().n_decode
    engine = EmbeddingEngine(llama, 4, 4)
    loop = asyncio.new_event_loop()
    try:
        async def run() -> list:
            jobs = [Job(loop) for _ in lists]
            with engine._cv:  # the scheduler waits for the lock: all four are queued before it looks
                for job, ls in zip(jobs, lists):
                    engine.submit(job, EmbedRequest(ls))
            return [await job.get(timeout=60) for job in jobs]

        events = loop.run_until_complete(run())
        n_decode = engine.n_decode - n0
    finally:
        engine.close()
        loop.close()
    assert engine.passes == 1 and n_decode == 1  # the 8 inputs fit one decode
    for (kind, out), ref, ls in zip(events, alone, lists):
        assert kind == "result"
        np.testing.assert_allclose(np.asarray(out["rows"]), ref, rtol=1e-4, atol=1e-4)
        assert out["usage"]["prompt_tokens"] == sum(len(t) for t in ls)

"""``/v1/embeddings`` with token ids and ``dimensions``, and ``/v1/rerank`` on a real reranker (a BERT with a
classifier head, pooling rank), compared with ``LlamaEmbedding`` in process."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from build_tools.fixtures import fixture_path

from .conftest import THREADS


@pytest.fixture(scope="module")
def rank_path():
    return fixture_path("embedding_model", pooling="rank")


@pytest.fixture(scope="module")
def srv(start_server, embed_path, rank_path, spm_path):
    return start_server([{"model": str(embed_path), "model_alias": "embed", "embedding": True, "n_ctx": 256},
                         {"model": str(rank_path), "model_alias": "rank", "embedding": True, "n_ctx": 256},
                         {"model": str(spm_path), "model_alias": "spm", "n_ctx": 128}])


def test_token_ids_embed_as_their_text(srv):
    tokens = httpx.post(srv.url + "/extras/tokenize", json={"model": "embed", "input": "hello there"}).json()["tokens"]
    by_text = httpx.post(srv.url + "/v1/embeddings", json={"model": "embed", "input": "hello there"}).json()
    by_ids = httpx.post(srv.url + "/v1/embeddings", json={"model": "embed", "input": tokens}).json()
    many = httpx.post(srv.url + "/v1/embeddings", json={"model": "embed", "input": [tokens, tokens[:2]]}).json()
    assert np.allclose(by_ids["data"][0]["embedding"], by_text["data"][0]["embedding"], atol=1e-6)
    assert by_ids["usage"]["prompt_tokens"] == len(tokens) and len(many["data"]) == 2
    assert many["usage"]["prompt_tokens"] == len(tokens) + 2


def test_dimensions_truncate_and_renormalise(srv):
    full = np.asarray(srv.client().embeddings.create(model="embed", input="hello there").data[0].embedding)
    short = np.asarray(srv.client().embeddings.create(model="embed", input="hello there", dimensions=8)
                       .data[0].embedding)
    assert short.shape == (8,) and np.isclose(np.linalg.norm(short), 1.0, atol=1e-5)
    assert np.allclose(short, full[:8] / np.linalg.norm(full[:8]), atol=1e-5)
    r = httpx.post(srv.url + "/v1/embeddings", json={"model": "embed", "input": "a", "dimensions": 100000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"


@pytest.mark.parametrize("body, param", [
    ({"input": [999999]}, None), ({"input": []}, "input"), ({"input": [[]]}, "input")])
def test_bad_embedding_inputs(srv, body, param):
    r = httpx.post(srv.url + "/v1/embeddings", json={"model": "embed", **body})
    assert r.status_code == 400 and r.json()["error"]["message"]
    if param:
        assert r.json()["error"]["param"] == param


def test_rerank_matches_llama_embedding(srv, rank_path):
    from llama_cpp.llama_embedding import LlamaEmbedding

    docs = ["the cat sat", "a dog ran", "hello there", "cats and dogs"]
    r = httpx.post(srv.url + "/v1/rerank", json={"model": "rank", "query": "cat", "documents": docs,
                                                 "top_n": 3, "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    with LlamaEmbedding(str(rank_path), pooling_type="rank", n_ctx=256, verbose=False, **THREADS) as ref:
        want = np.asarray(ref.rank("cat", docs))
    order = list(np.argsort(-want, kind="stable")[:3])
    assert [x["index"] for x in body["results"]] == order
    assert np.allclose([x["relevance_score"] for x in body["results"]], want[order], atol=1e-4)
    assert [x["document"]["text"] for x in body["results"]] == [docs[i] for i in order]
    assert body["usage"]["prompt_tokens"] > 0 and body["object"] == "list"
    alias = httpx.post(srv.url + "/rerank", json={"model": "rank", "query": "cat", "documents": [{"text": "x"}]})
    assert alias.status_code == 200 and "document" not in alias.json()["results"][0]


@pytest.mark.parametrize("body, status, needle", [
    ({"model": "rank", "query": "q", "documents": ["a"], "top_n": -1}, 400, "top_n"),
    ({"model": "rank", "query": "q", "documents": []}, 400, "documents"),
    ({"model": "rank", "query": "q", "documents": [3]}, 400, "documents[0]"),
    ({"model": "embed", "query": "q", "documents": ["a"]}, 400, "'embed' is not a reranker"),
    ({"model": "spm", "query": "q", "documents": ["a"]}, 400, "'spm' was not loaded for reranking"),
])
def test_bad_rerank_requests(srv, body, status, needle):
    r = httpx.post(srv.url + "/v1/rerank", json=body)
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text


def test_embeddings_refuse_a_reranker(srv):
    r = httpx.post(srv.url + "/v1/embeddings", json={"model": "rank", "input": "a"})
    assert r.status_code == 400 and "/v1/rerank" in r.json()["error"]["message"]

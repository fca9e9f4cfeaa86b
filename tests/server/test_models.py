"""Model routing and loading: aliases, lazy loading, vocab-only models."""

from __future__ import annotations

import httpx


def test_lazy_load_and_routing(start_server, spm_path, embed_path):
    srv = start_server([{"model": str(spm_path), "model_alias": "first", "n_ctx": 128},
                        {"model": str(spm_path), "model_alias": "second", "n_ctx": 128, "n_parallel": 2}],
                       lazy_load=True)
    reg = srv.app.state.registry
    assert not reg.get("first").loaded and not reg.get("second").loaded
    assert httpx.get(srv.url + "/health").json()["status"] == "ok"
    r = srv.client().completions.create(model="second", prompt="a", max_tokens=3, temperature=0)
    assert r.model == "second" and r.usage.completion_tokens == 3
    assert reg.get("second").loaded and not reg.get("first").loaded
    # no model named: the first configured one
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}).json()
    assert r["model"] == "first" and reg.get("first").loaded


def test_vocab_only_model_tokenizes_but_does_not_generate(start_server, spm_path):
    srv = start_server([{"model": str(spm_path), "model_alias": "vocab", "vocab_only": True}])
    toks = httpx.post(srv.url + "/extras/tokenize", json={"input": "hello there"}).json()["tokens"]
    assert toks and all(isinstance(t, int) for t in toks)
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2})
    assert r.status_code == 400 and "vocab_only" in r.json()["error"]["message"]

"""A bounded load test mixing every endpoint on loopback: chat, completions, responses, messages, embeddings
and tokenize from 12 clients at once, some requests oversized or invalid. Each is answered or refused
with 429 (busy), 413 (too large), 400 or 422 (invalid); afterwards memory and file descriptors are back
where they started, and the shared prompt cache never held more than its limit."""

from __future__ import annotations

import gc
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from llama_cpp.server.engine.prompt_cache import PromptCache

from .test_load import open_fds, rss_kib
from .test_slots import assert_kv_matches_bookkeeping, wait_for

pytestmark = pytest.mark.slow

N_REQUESTS = 240
N_CLIENTS = 12
BODY_LIMIT = 32 * 1024


def _request(i: int, url: str, http: httpx.Client) -> tuple[str, int]:
    """Request ``i`` of the mix: (what it was, its status); checks the body of each success."""
    talk = f"conversation {i % 10} is about the number {i % 10} and " + "more words " * (i % 10)
    kind = ("chat", "completions", "responses", "messages", "embeddings", "tokenize", "chat-stream",
            "oversized", "invalid", "bad-json", "overflow", "messages-stream")[i % 12]
    if kind in ("chat", "chat-stream"):
        body = {"model": "m", "messages": [{"role": "user", "content": talk}], "max_tokens": 6, "temperature": 0}
        if kind == "chat-stream":
            body |= {"stream": True, "stream_options": {"include_usage": True}}
            with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
                if r.status_code == 200:
                    lines = [x for x in r.iter_lines() if x.startswith("data:")]
                    assert lines[-1] == "data: [DONE]"
                return kind, r.status_code
        r = http.post(url + "/v1/chat/completions", json=body)
        if r.status_code == 200:
            u = r.json()["usage"]
            assert 0 <= u["prompt_tokens_details"]["cached_tokens"] < u["prompt_tokens"]
    elif kind == "completions":
        r = http.post(url + "/v1/completions", json={"model": "m", "prompt": talk, "max_tokens": 6})
        if r.status_code == 200:
            assert r.json()["usage"]["completion_tokens"] <= 6
    elif kind == "responses":
        r = http.post(url + "/v1/responses", json={"model": "m", "input": talk, "max_output_tokens": 6,
                                                    "temperature": 0})
        if r.status_code == 200:
            assert r.json()["status"] in ("completed", "incomplete")
            assert "cached_tokens" in r.json()["usage"]["input_tokens_details"]
    elif kind in ("messages", "messages-stream"):
        body = {"model": "m", "max_tokens": 6, "messages": [{"role": "user", "content": talk}],
                "stream": kind == "messages-stream"}
        with http.stream("POST", url + "/v1/messages", json=body) as r:
            data = r.read()
            if r.status_code == 200 and kind == "messages":
                assert "cache_read_input_tokens" in httpx.Response(200, content=data).json()["usage"]
            elif r.status_code == 200:
                assert b"message_stop" in data
            return kind, r.status_code
    elif kind == "embeddings":
        r = http.post(url + "/v1/embeddings", json={"model": "e", "input": [talk, "another text"]})
        if r.status_code == 200:
            assert len(r.json()["data"]) == 2
    elif kind == "tokenize":
        r = http.post(url + "/extras/tokenize", json={"model": "m", "input": talk})
        if r.status_code == 200:
            assert r.json()["tokens"]
    elif kind == "oversized":
        r = http.post(url + "/v1/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": "x" * (BODY_LIMIT + 100)}]})
    elif kind == "invalid":
        r = http.post(url + "/v1/chat/completions", json={"model": "m", "messages": "not a list", "max_tokens": -3})
    elif kind == "bad-json":
        r = http.post(url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    else:  # a prompt longer than a slot's context
        r = http.post(url + "/v1/completions", json={"model": "m", "prompt": "word " * 600, "max_tokens": 4})
    return kind, r.status_code


def test_mixed_endpoints_under_load(start_server, spm_path, embed_path, monkeypatch):
    over: list[tuple[int, int]] = []
    save = PromptCache.save

    def checked_save(self, *args, **kw):  # the cache's size after every store, against its limit
        ok = save(self, *args, **kw)
        if self.limit is not None and self.size > self.limit:
            over.append((self.size, self.limit))
        return ok

    monkeypatch.setattr(PromptCache, "save", checked_save)
    srv = start_server([{"model": str(spm_path), "model_alias": "m", "n_parallel": 3, "n_ctx": 256,
                         "max_queue": 6, "cache_ram": 1},
                        {"model": str(embed_path), "model_alias": "e", "embedding": True, "n_ctx": 256,
                         "max_queue": 4}],
                       max_tokens_limit=64, max_body_bytes=BODY_LIMIT)
    engine = srv.engine("m")
    pc = engine.prompt_cache
    assert pc is not None and pc.limit == 1024 * 1024

    def client(k: int) -> list[tuple[str, int]]:
        with httpx.Client(timeout=120) as http:
            return [_request(i, srv.url, http) for i in range(k, N_REQUESTS, N_CLIENTS)]

    def run_all() -> list[tuple[str, int]]:
        with ThreadPoolExecutor(N_CLIENTS) as pool:
            return [s for part in pool.map(client, range(N_CLIENTS)) for s in part]

    run_all()  # warm-up: buffers, threads and caches reach their steady size
    assert wait_for(lambda: engine.busy == 0, 60)
    gc.collect()
    rss0, fds0 = rss_kib(), open_fds()
    results = run_all()
    assert len(results) == N_REQUESTS
    allowed = {"oversized": {413}, "invalid": {422}, "bad-json": {400}, "overflow": {400}}
    for kind, status in results:
        assert status in allowed.get(kind, {200, 429}), (kind, status)
    served = {kind for kind, status in results if status == 200}
    assert served >= {"chat", "completions", "responses", "messages", "embeddings", "tokenize"}, served
    assert wait_for(lambda: engine.busy == 0, 60)
    assert_kv_matches_bookkeeping(engine)
    assert not over, over
    assert pc.size <= pc.limit and pc.size == sum(len(e.data) for e in pc.entries)
    assert pc.saved > 0  # ten conversations on three slots: prompts were saved for later ones
    gc.collect()
    assert wait_for(lambda: open_fds() <= fds0, 10), (fds0, open_fds())
    assert rss_kib() - rss0 < 16 * 1024, (rss0, rss_kib())

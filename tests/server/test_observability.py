"""``/metrics`` (read by prometheus_client's parser), ``/slots``, ``/props`` and the access log."""

from __future__ import annotations

import logging
import time

import httpx
import pytest

parser = pytest.importorskip("prometheus_client.parser")

KEY = "sk-metrics-secret"


@pytest.fixture(scope="module")
def srv(start_server, spm_path, embed_path):
    return start_server([{"model": str(spm_path), "model_alias": "spm", "n_parallel": 2, "n_ctx": 128},
                         {"model": str(embed_path), "model_alias": "embed", "embedding": True, "n_ctx": 128},
                         # one request at a time through Llama: counted as the slots are
                         {"model": str(spm_path), "model_alias": "serial", "n_parallel": 0, "n_ctx": 128},
                         {"model": str(spm_path), "model_alias": "serial-spec", "n_parallel": 0, "n_ctx": 128,
                          "spec_type": "ngram-simple", "spec_ngram_simple": {"size_n": 2, "size_m": 8},
                          "draft_n_max": 4}],
                        api_key=KEY)


def _get(srv, path, **kw):
    return httpx.get(srv.url + path, headers={"Authorization": f"Bearer {KEY}"}, **kw)


def _samples(text):
    out = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_what_was_served(srv):
    before = _samples(_get(srv, "/metrics").text)
    c = srv.client(api_key=KEY)
    r = c.completions.create(model="spm", prompt="hello there", max_tokens=5, temperature=0)
    c.embeddings.create(model="embed", input="hello")
    text = _get(srv, "/metrics").text
    after = _samples(text)
    spm = (("model", "spm"),)

    def grew(name, labels=spm):
        return after[(name, labels)] - before.get((name, labels), 0.0)

    assert grew("llamacpp:tokens_predicted_total") == r.usage.completion_tokens
    assert (grew("llamacpp:prompt_tokens_total") + grew("llamacpp:prompt_tokens_cached_total")
            == r.usage.prompt_tokens)
    assert grew("llamacpp:n_decode_total") >= 1 and grew("llamacpp:prompt_seconds_total") > 0
    assert after[("llamacpp:requests_processing", spm)] == 0 and after[("llamacpp:requests_deferred", spm)] == 0
    assert 0 < after[("llamacpp:kv_cache_usage_ratio", spm)] <= 1  # the prompt is kept for reuse
    assert grew("llamacpp:prompt_tokens_total", (("model", "embed"),)) > 0
    assert grew("llamacpp:n_decode_total", (("model", "embed"),)) == 1  # one input: one decode
    # per key: a hash label, never the key
    assert KEY not in text
    label = next(dict(k[1])["key"] for k in after if k[0] == "llamacpp:key_tokens_predicted_total")
    assert label.startswith("key-")
    assert after[("llamacpp:key_tokens_predicted_total", (("key", label),))] >= r.usage.completion_tokens
    ok = after[("llamacpp:key_requests_total", (("key", label), ("status", "200")))]
    assert ok >= 3
    httpx.get(srv.url + "/metrics")  # no key: 401, counted under anonymous
    again = _samples(_get(srv, "/metrics").text)
    assert again[("llamacpp:key_requests_total", (("key", "anonymous"), ("status", "401")))] >= 1


def test_serial_models_count_as_slot_models_do(srv):
    before = _samples(_get(srv, "/metrics").text)
    c = srv.client(api_key=KEY)
    whole = c.completions.create(model="serial", prompt="hello there", max_tokens=6, temperature=0)
    streamed = list(c.completions.create(model="serial", prompt="hello there", max_tokens=6, temperature=0,
                                         stream=True))
    assert "".join(x.choices[0].text for x in streamed) == whole.choices[0].text  # the same tokens
    spec = httpx.post(srv.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=120, json={
        "model": "serial-spec", "prompt": "a b c a b c a b c a b c a b c a b", "max_tokens": 20,
        "temperature": 0}).json()["usage"]["speculative"]
    after = _samples(_get(srv, "/metrics").text)

    def grew(name, model="serial"):
        key = (name, (("model", model),))
        return after[key] - before.get(key, 0.0)

    assert grew("llamacpp:tokens_predicted_total") == 2 * whole.usage.completion_tokens > 0
    assert (grew("llamacpp:prompt_tokens_total") + grew("llamacpp:prompt_tokens_cached_total")
            == 2 * whole.usage.prompt_tokens)
    assert grew("llamacpp:prompt_seconds_total") > 0 and grew("llamacpp:tokens_predicted_seconds_total") > 0
    assert after[("llamacpp:predicted_tokens_seconds", (("model", "serial"),))] > 0
    # the second request reuses all its prompt but the last token (evaluated again for its logits); each
    # request decodes its prompt once and every generated token but the last
    assert grew("llamacpp:prompt_tokens_cached_total") == whole.usage.prompt_tokens - 1
    assert grew("llamacpp:n_decode_total") == 2 * (1 + whole.usage.completion_tokens - 1)
    assert ("llamacpp:n_decode_total", (("model", "serial-spec"),)) not in after  # its decoder's are not counted
    # the context keeps the last request's tokens for prefix reuse
    kept = after[("llamacpp:kv_cache_tokens", (("model", "serial"),))]
    assert whole.usage.prompt_tokens <= kept <= whole.usage.total_tokens
    assert after[("llamacpp:kv_cache_usage_ratio", (("model", "serial"),))] == kept / srv.engine("serial").n_ctx_slot
    # the speculative decoder's statistics, request by request
    assert spec["drafted"] > 0 and spec["steps"] > 0
    assert grew("llamacpp:spec_decode_num_draft_tokens_total", "serial-spec") == spec["drafted"]
    assert grew("llamacpp:spec_decode_num_accepted_tokens_total", "serial-spec") == spec["accepted"]
    assert grew("llamacpp:spec_decode_num_drafts_total", "serial-spec") == spec["steps"]
    assert ("llamacpp:spec_decode_num_drafts_total", (("model", "serial"),)) not in after  # no speculation


def test_serial_requests_processing_and_deferred(srv):
    import asyncio
    import threading

    from llama_cpp.server.engine import Job

    engine = srv.engine("serial")
    started, gate = threading.Event(), threading.Event()

    def held(_llama):
        started.set()
        gate.wait(30)
        return {"usage": {}}

    loop = asyncio.new_event_loop()  # the jobs' events are queued on it, never read
    try:
        for _ in range(2):
            engine.submit(Job(loop), held)
        assert started.wait(30)
        now = _samples(_get(srv, "/metrics").text)
        serial = (("model", "serial"),)
        assert now[("llamacpp:requests_processing", serial)] == 1
        assert now[("llamacpp:requests_deferred", serial)] == 1
    finally:
        gate.set()
        deadline = time.monotonic() + 30
        while engine.busy and time.monotonic() < deadline:
            time.sleep(0.02)
        loop.close()
    done = _samples(_get(srv, "/metrics").text)
    assert done[("llamacpp:requests_processing", serial)] == 0 and done[("llamacpp:requests_deferred", serial)] == 0


def test_slots_and_props(srv):
    slots = _get(srv, "/slots").json()
    assert [s["id"] for s in slots] == [0, 1] and all(s["n_ctx"] == 128 for s in slots)
    assert all(s["is_processing"] is False and s["speculative"] is False for s in slots)
    assert _get(srv, "/slots", params={"model": "embed"}).json()[0]["id"] == 0
    props = _get(srv, "/props").json()
    assert props["total_slots"] == 2 and props["model_alias"] == "spm"
    assert props["default_generation_settings"]["n_ctx"] == 128
    assert props["default_generation_settings"]["params"]["temperature"] == 0.8
    assert "im_start" in props["chat_template"] and props["modalities"]["vision"] is False
    assert _get(srv, "/props", params={"model": "nope"}).status_code == 404
    assert httpx.get(srv.url + "/props").status_code == 401


def test_one_access_log_line_per_request(srv, caplog):
    wanted = {"/v1/models", "/v1/completions"}

    def lines():
        return [r for r in caplog.records if r.name == "llama_cpp.server.access" and r.access["path"] in wanted]

    with caplog.at_level(logging.INFO, logger="llama_cpp.server.access"):
        _get(srv, "/v1/models")
        httpx.post(srv.url + "/v1/completions", json={"model": "spm", "prompt": "x"})
        deadline = time.monotonic() + 10  # the line is written once the response's last byte is sent
        while len(lines()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    lines = lines()
    assert [(r.access["method"], r.access["path"], r.access["status"]) for r in lines] == [
        ("GET", "/v1/models", 200), ("POST", "/v1/completions", 401)]
    assert lines[0].access["key"].startswith("key-") and lines[1].access["key"] == "anonymous"
    assert "status=200" in lines[0].getMessage() and KEY not in lines[0].getMessage()
    assert lines[0].access["duration_ms"] >= 0

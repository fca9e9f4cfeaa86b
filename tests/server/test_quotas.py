"""Several API keys from ``api_key_file``, with per-key concurrent-request and tokens-per-minute limits."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from llama_cpp.server.quotas import load_key_file


@pytest.fixture(scope="module")
def srv(start_server, spm_path, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("# team keys\nsk-one concurrent=1\n\nsk-tpm tpm=10\nsk-free\n")
    return start_server([{"model": str(spm_path), "model_alias": "spm", "n_parallel": 4, "n_ctx": 256}],
                        api_key_file=str(keys), max_tokens_limit=200)


def _post(srv, key, path="/v1/completions", **body):
    body = {"model": "spm", "prompt": "hello", "max_tokens": 4, "temperature": 0, **body}
    return httpx.post(srv.url + path, headers={"Authorization": f"Bearer {key}"}, json=body, timeout=120)


def test_every_key_of_the_file_is_accepted(srv):
    assert _post(srv, "sk-free").status_code == 200
    assert _post(srv, "sk-one").status_code == 200
    r = _post(srv, "sk-other")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_concurrent_limit_answers_429_with_retry_after(srv, script, monkeypatch):
    # a long answer, one token per 20 ms: the first request stays in flight while the others are sent
    script(srv, "spm", " word" * 150)
    engine = srv.engine("spm")
    step = engine._step

    def slow_step() -> None:
        time.sleep(0.02)
        step()

    monkeypatch.setattr(engine, "_step", slow_step)
    started = threading.Event()
    done = threading.Event()

    def long_stream() -> None:
        body = {"model": "spm", "prompt": "hello", "max_tokens": 150, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", headers={"Authorization": "Bearer sk-one"},
                          json=body, timeout=120) as r:
            for _ in r.iter_lines():
                started.set()
                if done.is_set():
                    break
        started.set()

    t = threading.Thread(target=long_stream)
    t.start()
    try:
        assert started.wait(60)
        r = _post(srv, "sk-one")
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        err = r.json()["error"]
        assert err["type"] == "rate_limit_error" and "1 concurrent requests" in err["message"]
        a = httpx.post(srv.url + "/v1/messages", headers={"x-api-key": "sk-one"},
                       json={"model": "spm", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert a.status_code == 429 and a.json()["error"]["type"] == "rate_limit_error" and a.json()["type"] == "error"
        assert _post(srv, "sk-free").status_code == 200  # other keys are not held back
    finally:
        done.set()
        t.join(120)
    assert _post(srv, "sk-one").status_code == 200  # its place is free again


def test_tokens_per_minute(srv):
    first = _post(srv, "sk-tpm", max_tokens=8)
    assert first.status_code == 200 and first.json()["usage"]["total_tokens"] >= 10
    r = _post(srv, "sk-tpm")
    assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 60
    assert "10 tokens per minute" in r.json()["error"]["message"]


def test_a_bad_key_file_names_its_line(tmp_path):
    bad = tmp_path / "k.txt"
    bad.write_text("sk-a tpm=5\nsk-b rpm=3\n")
    with pytest.raises(ValueError, match=r"k.txt:2: 'rpm=3'"):
        load_key_file(str(bad))
    bad.write_text("sk-a\nsk-a\n")
    with pytest.raises(ValueError, match="listed twice"):
        load_key_file(str(bad))
    ok = tmp_path / "ok.txt"
    ok.write_text("sk-x concurrent=2\nsk-y\n")
    limits = load_key_file(str(ok))
    assert limits["sk-x"].concurrent == 2 and limits["sk-x"].tpm is None and limits["sk-y"].concurrent is None
    with pytest.raises(ValueError, match="not found"):
        load_key_file(str(tmp_path / "missing.txt"))

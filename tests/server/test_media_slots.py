"""Image and audio chat on a projector model in the slots: concurrent greedy clients each get the answer the
one-at-a-time engine (the model's chat handler) gives; a prompt's media is reused from a slot's KV cache
only where the same media sits at the same place."""

from __future__ import annotations

import base64
import threading

import httpx
import pytest

from build_tools.fixtures import fixture_path, png_bytes
from llama_cpp.server.engine import SerialEngine, SlotEngine

from .together import run_together

CTX = {"n_ctx": 512, "n_batch": 64, "n_ubatch": 64}


@pytest.fixture(scope="module")
def srv(start_server, spm_path):
    vision, audio = str(fixture_path("mmproj_vision")), str(fixture_path("mmproj_audio"))
    hybrid = str(fixture_path("qwen35_mtp", form="noisy"))
    return start_server([
        {"model": str(spm_path), "model_alias": "vision", "n_parallel": 4, "clip_model_path": vision, **CTX},
        {"model": str(spm_path), "model_alias": "vision-serial", "n_parallel": 0, "clip_model_path": vision, **CTX},
        {"model": str(spm_path), "model_alias": "vision-one", "n_parallel": 1, "clip_model_path": vision, **CTX},
        {"model": str(spm_path), "model_alias": "audio", "n_parallel": 2, "clip_model_path": audio, **CTX},
        {"model": str(spm_path), "model_alias": "audio-serial", "n_parallel": 0, "clip_model_path": audio, **CTX},
        # a hybrid model (attention and recurrent layers): its memory cannot drop a suffix
        {"model": hybrid, "model_alias": "hybrid", "n_parallel": 2, "clip_model_path": vision, **CTX},
        {"model": hybrid, "model_alias": "hybrid-serial", "n_parallel": 0, "clip_model_path": vision, **CTX}])


def _png(seed: int) -> dict:
    url = "data:image/png;base64," + base64.b64encode(png_bytes(seed=seed)).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def _wav() -> dict:
    data = base64.b64encode(fixture_path("wav").read_bytes()).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def _chat(text: str, *media: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, *media, {"type": "text", "text": "ok?"}]}]


def _ask(srv, model: str, messages: list[dict], n: int = 16) -> dict:
    r = httpx.post(srv.url + "/v1/chat/completions", timeout=120,
                   json={"model": model, "messages": messages, "max_tokens": n, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def _concurrently(srv, model: str, chats: list[list[dict]]) -> list[dict]:
    return run_together(lambda chat: _ask(srv, model, chat), chats)


def test_projector_models_are_served_in_slots(srv):
    assert isinstance(srv.engine("vision"), SlotEngine) and srv.engine("vision").n_slots == 4
    assert isinstance(srv.engine("vision-serial"), SerialEngine)
    assert httpx.get(srv.url + "/health").json()["models"]["vision"]["engine"] == "slots"


def _queued_together(monkeypatch, engine: SlotEngine, n: int) -> None:
    """The engine's next ``n`` requests are queued at once, after the last of them arrives: one admission
    (each image is encoded before its request queues, one encode at a time, so clients sent together
    would otherwise reach the scheduler apart, and a 16-token answer can end before the next arrives)."""
    real, held, lock = engine.submit_many, [], threading.Lock()

    def submit_many(items: list) -> None:
        with lock:
            held.extend(items)
            if len(held) < n:
                return
            together = list(held)
        monkeypatch.setattr(engine, "submit_many", real)
        real(together)

    monkeypatch.setattr(engine, "submit_many", submit_many)


def test_four_concurrent_image_chats_equal_one_at_a_time(srv, monkeypatch):
    chats = [_chat("what is in the picture?", _png(1)), _chat("describe", _png(2)),
             _chat("two pictures:", _png(3), _png(1)), _chat("no picture here, just text")]
    want = [_ask(srv, "vision-serial", c) for c in chats]
    steps = srv.engine("vision").steps
    _queued_together(monkeypatch, srv.engine("vision"), len(chats))
    got = _concurrently(srv, "vision", chats)
    for g, w in zip(got, want):
        assert g["choices"][0]["message"]["content"] == w["choices"][0]["message"]["content"]
        assert g["usage"]["completion_tokens"] == w["usage"]["completion_tokens"] == 16
        assert g["usage"]["prompt_tokens"] == w["usage"]["prompt_tokens"]
    assert want[0]["usage"]["prompt_tokens"] > 16 and want[2]["usage"]["prompt_tokens"] > 32  # 16 rows an image
    # the four requests share their decode steps: fewer than one request after another would take
    assert srv.engine("vision").steps - steps < sum(w["usage"]["completion_tokens"] for w in want)
    stream = list(srv.client().chat.completions.create(model="vision", messages=chats[2], max_tokens=16,
                                                       temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in stream) == want[2]["choices"][0]["message"]["content"]


def test_concurrent_audio_chats_equal_one_at_a_time(srv):
    chats = [_chat("listen:", _wav()), _chat("and this?", _wav())]
    want = [_ask(srv, "audio-serial", c) for c in chats]
    got = _concurrently(srv, "audio", chats)
    for g, w in zip(got, want):
        assert g["choices"][0]["message"]["content"] == w["choices"][0]["message"]["content"]
        assert g["usage"]["prompt_tokens"] == w["usage"]["prompt_tokens"] > 30


def test_media_is_reused_only_where_the_same_media_is(srv):
    first = _chat("what is in the picture?", _png(5))
    a = _ask(srv, "vision-one", first)
    again = _ask(srv, "vision-one", first)
    n = a["usage"]["prompt_tokens"]
    assert again["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == n - 1  # all but the last token
    other = _chat("what is in the picture?", _png(6))  # the same text around another image
    b = _ask(srv, "vision-one", other)
    cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached <= n - 16 - 2  # the text before the image, not the image nor what follows it
    assert b["choices"][0]["message"]["content"] == _ask(srv, "vision-serial", other)["choices"][0]["message"]["content"]
    # a longer conversation that starts with the first one reuses its image too
    longer = first + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                      {"role": "user", "content": "and then?"}]
    _ask(srv, "vision-one", first)
    c = _ask(srv, "vision-one", longer)
    assert c["usage"]["prompt_tokens_details"]["cached_tokens"] > 16
    assert c["choices"][0]["message"]["content"] == _ask(srv, "vision-serial", longer)["choices"][0]["message"]["content"]


def test_bad_media_ends_only_its_request(srv):
    r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
        "model": "vision", "max_tokens": 4,
        "messages": _chat("x", {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}})})
    assert r.status_code == 400, r.text
    r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
        "model": "vision", "max_tokens": 4, "logprobs": True, "messages": _chat("x", _png(1))})
    assert r.status_code == 400 and "logprobs" in r.json()["error"]["message"], r.text
    assert _ask(srv, "vision", _chat("still fine", _png(1)), 4)["usage"]["completion_tokens"] == 4


def test_hybrid_model_media_chats_equal_one_at_a_time(srv):
    """Recurrent memory reuses only whole states or checkpoints: a repeated chat, a longer one and concurrent
    ones all get the one-at-a-time answer."""
    first = _chat("what is in the picture?", _png(7))
    chats = [first, _chat("describe", _png(8))]
    want = [_ask(srv, "hybrid-serial", c) for c in chats]
    got = _concurrently(srv, "hybrid", chats)
    for g, w in zip(got, want):
        assert g["choices"][0]["message"]["content"] == w["choices"][0]["message"]["content"]
    again = _ask(srv, "hybrid", first)
    assert again["choices"][0]["message"]["content"] == want[0]["choices"][0]["message"]["content"]
    # rewound to the checkpoint taken 4 tokens before the prompt's end: the image (16 rows) included
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["usage"]["prompt_tokens"] - 4 > 16
    longer = first + [{"role": "assistant", "content": want[0]["choices"][0]["message"]["content"]},
                      {"role": "user", "content": "and then?"}]
    assert (_ask(srv, "hybrid", longer)["choices"][0]["message"]["content"]
            == _ask(srv, "hybrid-serial", longer)["choices"][0]["message"]["content"])

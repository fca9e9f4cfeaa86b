"""MTP speculative decoding and image chat served one request at a time (the serial engine; MTP in the
slots is tests/server/test_spec_slots_mtp.py)."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import httpx
import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import Llama
from llama_cpp.mtmd_chat import MTMDChatHandler

from .conftest import THREADS

MTP_CTX = {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64}


@pytest.fixture(scope="module")
def mtp_server(start_server):
    path = str(fixture_path("qwen35_mtp", form="noisy"))
    return start_server([{"model": path, "model_alias": "mtp", "spec_type": "draft-mtp", "draft_n_max": 3,
                          "n_parallel": 0, **MTP_CTX},
                         {"model": path, "model_alias": "plain", "n_parallel": 2, **MTP_CTX}])


@pytest.mark.parametrize("prompt", ["Hello world, this is a test", "The quick brown fox"])
def test_mtp_greedy_equals_plain(mtp_server, prompt):
    c = mtp_server.client()
    plain = c.completions.create(model="plain", prompt=prompt, max_tokens=32, temperature=0)
    mtp = c.completions.create(model="mtp", prompt=prompt, max_tokens=32, temperature=0)
    assert mtp.choices[0].text == plain.choices[0].text
    assert mtp.usage.completion_tokens == plain.usage.completion_tokens == 32
    spec = mtp.model_dump()["usage"]["speculative"]
    assert spec["drafted"] > 0 and 0 <= spec["accepted"] <= spec["drafted"]
    assert "speculative" not in plain.model_dump()["usage"]
    stream = list(c.completions.create(model="mtp", prompt=prompt, max_tokens=32, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in stream) == plain.choices[0].text
    assert stream[-1].model_dump()["usage"]["speculative"]["drafted"] > 0
    h = httpx.get(mtp_server.url + "/health").json()["models"]
    assert h["mtp"]["engine"] == "serial" and h["plain"]["engine"] == "slots"


@pytest.fixture(scope="module")
def spec_server(start_server):
    """The echo target with each kind of drafter the server takes, and without one."""
    target = str(fixture_path("qwen35_mtp", form="echo"))
    draft = str(fixture_path("draft_model", form="echo"))
    return start_server([
        {"model": target, "model_alias": "plain", "n_parallel": 2, **MTP_CTX},
        {"model": target, "model_alias": "ngram", "spec_type": "ngram-simple,ngram-map-k", **MTP_CTX},
        {"model": target, "model_alias": "draft", "spec_type": "draft-simple", "draft_model_path": draft,
         "draft_n_max": 4, **MTP_CTX},
        # upstream's prompt lookup verifies drafts by removing rejected KV entries: an attention-only target
        {"model": str(fixture_path("llama_bpe")), "model_alias": "lookup", "draft_model": "prompt-lookup-decoding",
         "draft_model_num_pred_tokens": 4, **MTP_CTX},
        {"model": str(fixture_path("llama_bpe")), "model_alias": "plain-bpe", "n_parallel": 2, **MTP_CTX}])


@pytest.mark.parametrize("alias", ["ngram", "draft", "lookup"])
def test_every_speculative_kind_keeps_greedy_output(spec_server, alias):
    c = spec_server.client()
    # a 16-word block three times: its last 12 tokens (llama.cpp's default n-gram) occur earlier
    prompt = " ".join(["one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
                       "fifteen sixteen"] * 3)
    ref = "plain-bpe" if alias == "lookup" else "plain"
    plain = c.completions.create(model=ref, prompt=prompt, max_tokens=24, temperature=0)
    got = c.completions.create(model=alias, prompt=prompt, max_tokens=24, temperature=0)
    assert got.choices[0].text == plain.choices[0].text
    streamed = list(c.completions.create(model=alias, prompt=prompt, max_tokens=24, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in streamed) == plain.choices[0].text
    chat = [{"role": "user", "content": prompt}]
    assert (c.chat.completions.create(model=alias, messages=chat, max_tokens=12, temperature=0)
            .choices[0].message.content ==
            c.chat.completions.create(model=ref, messages=chat, max_tokens=12, temperature=0)
            .choices[0].message.content)
    if alias != "lookup":  # SpecConfig types report their statistics; upstream's draft_model has none
        spec = got.model_dump()["usage"]["speculative"]
        assert spec["drafted"] > 0 and 0 <= spec["accepted"] <= spec["drafted"]
    if alias == "draft":  # the echo draft predicts the echo target exactly
        spec = got.model_dump()["usage"]["speculative"]
        assert spec["accepted"] == spec["drafted"]


@pytest.mark.parametrize("settings, message", [
    ({"spec_type": "draft-eagle3"}, "needs a draft model"),
    ({"spec_type": "draft-dflash"}, "draft_model_path"),
    ({"spec_type": "draft-simple"}, "draft_model_path"),
    ({"spec_type": "ngram-bogus"}, "ngram-bogus"),
    ({"draft_model": "my-draft.gguf"}, "prompt-lookup-decoding"),
    ({"draft_model": "prompt-lookup-decoding", "spec_type": "ngram-simple"}, "choose one"),
])
def test_bad_speculative_settings_are_refused(settings, message):
    from llama_cpp.server.settings import ModelSettings

    with pytest.raises(ValueError, match=message):
        ModelSettings(model="m.gguf", **settings)


def _image_messages(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "what is in the picture?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("allowed")
    shutil.copy(fixture_path("png"), d / "pic.png")
    return d


@pytest.fixture(scope="module")
def image_server(start_server, spm_path, media_dir):
    return start_server([{"model": str(spm_path), "model_alias": "vision", "n_ctx": 512,
                          "clip_model_path": str(fixture_path("mmproj_vision")), "media_dirs": [str(media_dir)]}])


def test_image_chat_equals_the_handler(image_server, spm_path):
    png = fixture_path("png").read_bytes()
    msgs = _image_messages("data:image/png;base64," + base64.b64encode(png).decode())
    r = image_server.client().chat.completions.create(model="vision", messages=msgs, max_tokens=8, temperature=0)
    handler = MTMDChatHandler(fixture_path("mmproj_vision"), n_threads=1)
    with Llama(spm_path, n_ctx=512, chat_handler=handler, verbose=False, **THREADS) as ref_llm:
        ref = ref_llm.create_chat_completion(msgs, max_tokens=8, temperature=0, repeat_penalty=1.1)
    handler.close()
    assert r.choices[0].message.content == ref["choices"][0]["message"]["content"]
    assert r.usage.prompt_tokens == ref["usage"]["prompt_tokens"] > 16  # the image's 16 tokens are in it
    chunks = list(image_server.client().chat.completions.create(model="vision", messages=msgs, max_tokens=8,
                                                                temperature=0, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == r.choices[0].message.content


def test_image_from_the_allowed_directory(image_server, media_dir):
    r = image_server.client().chat.completions.create(
        model="vision", messages=_image_messages(str(media_dir / "pic.png")), max_tokens=4, temperature=0)
    assert r.usage.completion_tokens == 4


@pytest.mark.parametrize("url, words", [
    ("http://127.0.0.1:1/pic.png", "remote URLs are not fetched"),
    ("https://example.com/pic.png", "remote URLs are not fetched"),
    ("/etc/passwd", "inside the allowed media directories"),
])
def test_refused_image_urls(image_server, media_dir, url, words):
    r = httpx.post(image_server.url + "/v1/chat/completions", timeout=60,
                   json={"model": "vision", "messages": _image_messages(url), "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]


def test_path_escaping_the_allowed_directory(image_server, media_dir):
    outside = media_dir.parent / "outside.png"
    shutil.copy(fixture_path("png"), outside)
    for url in (str(outside), str(media_dir / ".." / "outside.png"), "file://" + str(outside)):
        r = httpx.post(image_server.url + "/v1/chat/completions", timeout=60,
                       json={"model": "vision", "messages": _image_messages(url), "max_tokens": 4})
        assert r.status_code == 400 and "inside the allowed media directories" in r.json()["error"]["message"], (url, r.text)


def test_spec_type_none_is_plain_serving():
    from llama_cpp.server.settings import ModelSettings

    s = ModelSettings(model="m.gguf", spec_type="none", n_parallel=2)
    assert s.spec_config() is None and not s.speculates and not s.serial


@pytest.fixture(scope="module")
def spec_image_server(start_server):
    """Image chat with MTP: the handler builds the Llama's decoder, so media chats speculate too."""
    return start_server([{"model": str(fixture_path("qwen35_mtp", form="echo")), "model_alias": "vision-mtp",
                          "n_ctx": 512, "spec_type": "draft-mtp", "draft_n_max": 3,
                          "clip_model_path": str(fixture_path("mmproj_vision"))}])


def test_image_chat_speculates(spec_image_server):
    png = fixture_path("png").read_bytes()
    msgs = _image_messages("data:image/png;base64," + base64.b64encode(png).decode())
    c = spec_image_server.client()
    r = c.chat.completions.create(model="vision-mtp", messages=msgs, max_tokens=16, temperature=0)
    handler = MTMDChatHandler(fixture_path("mmproj_vision"), n_threads=1)
    with Llama(fixture_path("qwen35_mtp", form="echo"), n_ctx=512, chat_handler=handler, verbose=False,
               **THREADS) as ref_llm:
        ref = ref_llm.create_chat_completion(msgs, max_tokens=16, temperature=0, repeat_penalty=1.1)
    handler.close()
    assert r.choices[0].message.content == ref["choices"][0]["message"]["content"]
    assert r.usage.completion_tokens == 16
    spec = r.model_dump()["usage"]["speculative"]
    assert spec["generated"] == 16 and 0 < spec["accepted"] <= spec["drafted"]
    chunks = list(c.chat.completions.create(model="vision-mtp", messages=msgs, max_tokens=16, temperature=0,
                                            stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == r.choices[0].message.content
    assert chunks[-1].model_dump()["usage"]["speculative"]["drafted"] > 0



@pytest.fixture(scope="module")
def tools_image_server(start_server, tmp_path_factory):
    """Image chat on a model whose template knows tools (Qwen 3's), served with a projector."""
    from llama_cpp._chat import native_chat
    from tests.chat.forcing import BOS, EOS, model_with_template

    template = Path(__file__).resolve().parents[2] / "vendor" / "llama.cpp" / "models" / "templates" / \
        "Qwen-Qwen3-0.6B.jinja"
    if not native_chat.available() or not template.is_file():
        pytest.skip("needs libllama-cpp-ext and the vendored llama.cpp templates")
    text = template.read_text(encoding="utf-8")
    with native_chat.ChatTemplates(text, bos_token=BOS, eos_token=EOS) as t:
        preserved = t.apply([{"role": "user", "content": "hi"}], tools=[TOOL]).preserved_tokens
    model = model_with_template(tmp_path_factory.mktemp("tools-image") / "qwen3.gguf", text, sorted(set(preserved)))
    return start_server([{"model": str(model), "model_alias": "vision-tools", "n_ctx": 1024, "n_parallel": 1,
                          "clip_model_path": str(fixture_path("mmproj_vision"))}])


TOOL = {"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {}}}}


def test_image_chat_takes_tools_and_checks_them(tools_image_server, image_server):
    """Tools reach the image-chat handler, whose chat layer renders and parses them; a bad tool is a 400
    naming it; a template that does not know tools is a 400 saying so."""
    msgs = _image_messages("data:image/png;base64," + base64.b64encode(fixture_path("png").read_bytes()).decode())
    body = {"messages": msgs, "max_tokens": 4, "temperature": 0, "tools": [TOOL]}
    r = httpx.post(tools_image_server.url + "/v1/chat/completions", timeout=120, json={"model": "vision-tools", **body})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"
    bad = {"type": "function", "function": {"name": "bad name!", "parameters": {"type": "object"}}}
    r = httpx.post(tools_image_server.url + "/v1/chat/completions", timeout=60,
                   json={"model": "vision-tools", **body, "tools": [bad]})
    assert r.status_code == 400 and "bad name!" in r.json()["error"]["message"], r.text
    r = httpx.post(image_server.url + "/v1/chat/completions", timeout=60, json={"model": "vision", **body})
    assert r.status_code == 400 and "a template that knows them" in r.json()["error"]["message"], r.text

"""The endpoints through the official ``openai`` client: completions, chat, streaming, tools, JSON
schema, logprobs, embeddings, models and the tokenize extras."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from llama_cpp import Llama

from .conftest import THREADS


@pytest.fixture(scope="module")
def solo(spm_path):
    """The same model run alone through Llama: what every greedy server answer must equal."""
    with Llama(spm_path, n_ctx=256, verbose=False, **THREADS) as m:
        yield m


def test_models_and_health(server):
    ids = [m.id for m in server.client().models.list().data]
    assert ids == ["spm", "embed"]
    h = httpx.get(server.url + "/health").json()
    assert h["status"] == "ok" and h["models"]["spm"]["engine"] == "slots" and h["models"]["spm"]["slots"] == 4
    assert h["models"]["embed"]["engine"] == "embeddings"  # concurrent requests batched


def test_completion_equals_llama(server, solo):
    c = server.client()
    r = c.completions.create(model="spm", prompt="hello there", max_tokens=12, temperature=0)
    ref = solo.create_completion("hello there", max_tokens=12, temperature=0, repeat_penalty=1.1)
    assert r.choices[0].text == ref["choices"][0]["text"]
    assert r.choices[0].finish_reason == ref["choices"][0]["finish_reason"] == "length"
    assert r.usage.prompt_tokens == ref["usage"]["prompt_tokens"]
    assert r.usage.completion_tokens == 12


def test_completion_stream_equals_non_stream(server):
    c = server.client()
    full = c.completions.create(model="spm", prompt="The capital of", max_tokens=10, temperature=0)
    chunks = list(c.completions.create(model="spm", prompt="The capital of", max_tokens=10, temperature=0,
                                       stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completion_stop_echo_logprobs_and_n(server, solo):
    c = server.client()
    ref = solo.create_completion("a", max_tokens=12, temperature=0, repeat_penalty=1.1)["choices"][0]["text"]
    words = ref.split()
    stop = " " + words[2]
    r = c.completions.create(model="spm", prompt="a", max_tokens=12, temperature=0, stop=[stop])
    assert r.choices[0].text == ref[:ref.index(stop)] and r.choices[0].finish_reason == "stop"
    e = c.completions.create(model="spm", prompt="a", max_tokens=3, temperature=0, echo=True)
    assert e.choices[0].text.startswith("a")
    lp = c.completions.create(model="spm", prompt="a", max_tokens=4, temperature=0, logprobs=3)
    block = lp.choices[0].logprobs
    assert len(block.tokens) == 4 and len(block.top_logprobs) == 4
    ref_lp = solo.create_completion("a", max_tokens=4, temperature=0, repeat_penalty=1.1, logprobs=3)
    assert np.allclose(block.token_logprobs, ref_lp["choices"][0]["logprobs"]["token_logprobs"], atol=1e-4)
    many = c.completions.create(model="spm", prompt="a", max_tokens=5, temperature=0, n=3)
    assert [ch.index for ch in many.choices] == [0, 1, 2]
    assert len({ch.text for ch in many.choices}) == 1  # greedy: every choice the same
    assert many.usage.completion_tokens == 15


def test_token_prompt(server, solo):
    toks = solo.tokenize(b"hello there")
    r = server.client().completions.create(model="spm", prompt=toks, max_tokens=6, temperature=0)
    ref = solo.create_completion(toks, max_tokens=6, temperature=0, repeat_penalty=1.1)
    assert r.choices[0].text == ref["choices"][0]["text"]


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]


def test_chat_equals_llama(server, solo):
    c = server.client()
    r = c.chat.completions.create(model="spm", messages=MESSAGES, max_tokens=10, temperature=0)
    ref = solo.create_chat_completion(MESSAGES, max_tokens=10, temperature=0, repeat_penalty=1.1)
    assert r.choices[0].message.content == ref["choices"][0]["message"]["content"]
    assert r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == ref["usage"]["prompt_tokens"]
    chunks = list(c.chat.completions.create(model="spm", messages=MESSAGES, max_tokens=10, temperature=0,
                                            stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_chat_logprobs(server):
    r = server.client().chat.completions.create(model="spm", messages=MESSAGES, max_tokens=4, temperature=0,
                                                logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == 4 and all(e.logprob <= 0 for e in content)
    assert all(1 <= len(e.top_logprobs) <= 3 for e in content)


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_chat_json_schema(server):
    r = server.client().chat.completions.create(
        model="spm", messages=MESSAGES, max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}})
    assert r.choices[0].finish_reason == "stop"
    value = json.loads(r.choices[0].message.content)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)


TOOLS = [{"type": "function", "function": {"name": "get_person", "description": "a person",
                                           "parameters": SCHEMA}}]


def test_chat_tools(server):
    c = server.client()
    r = c.chat.completions.create(model="spm", messages=MESSAGES, max_tokens=60, temperature=0, tools=TOOLS,
                                  tool_choice={"type": "function", "function": {"name": "get_person"}})
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_person"
    assert set(json.loads(call.function.arguments)) == {"name", "age"}
    chunks = list(c.chat.completions.create(model="spm", messages=MESSAGES, max_tokens=60, temperature=0,
                                            tools=TOOLS, tool_choice="required", stream=True))
    args = "".join(tc.function.arguments for ch in chunks for tc in (ch.choices[0].delta.tool_calls or []))
    assert json.loads(args) == json.loads(call.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_embeddings(server, embed_path):
    c = server.client()
    r = c.embeddings.create(model="embed", input=["hello there", "a"])  # the client asks for base64
    assert [d.index for d in r.data] == [0, 1]
    with Llama(embed_path, embedding=True, n_ctx=256, verbose=False, **THREADS) as m:
        ref = m.create_embedding(["hello there", "a"])
    for got, want in zip(r.data, ref["data"]):
        assert np.allclose(got.embedding, want["embedding"], atol=1e-5)
    assert r.usage.prompt_tokens == ref["usage"]["prompt_tokens"]
    floats = httpx.post(server.url + "/v1/embeddings", json={"model": "embed", "input": "a"}).json()
    assert np.allclose(floats["data"][0]["embedding"], ref["data"][1]["embedding"], atol=1e-5)


def test_embeddings_need_an_embedding_model(server):
    r = httpx.post(server.url + "/v1/embeddings", json={"model": "spm", "input": "a"})
    assert r.status_code == 400 and "embedding" in r.json()["error"]["message"]


def test_tokenize_extras(server, solo):
    toks = httpx.post(server.url + "/extras/tokenize", json={"model": "spm", "input": "hello there"}).json()
    assert toks["tokens"] == solo.tokenize(b"hello there", special=True)
    n = httpx.post(server.url + "/extras/tokenize/count", json={"model": "spm", "input": "hello there"}).json()
    assert n["count"] == len(toks["tokens"])
    text = httpx.post(server.url + "/extras/detokenize", json={"model": "spm", "tokens": toks["tokens"]}).json()
    assert text["text"].strip() == "hello there"


def test_openapi_page(server):
    spec = httpx.get(server.url + "/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/extras/tokenize"} <= set(spec["paths"])
    assert httpx.get(server.url + "/docs").status_code == 200


def test_streamed_choices_keep_their_index(server):
    chunks = list(server.client().chat.completions.create(model="spm", messages=MESSAGES, max_tokens=6,
                                                          temperature=0, n=2, stream=True))
    texts = {0: "", 1: ""}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
    assert texts[0] and texts[0] == texts[1]
    assert sorted(c.index for ch in chunks for c in ch.choices if c.finish_reason) == [0, 1]

"""Bad requests get the right status and a clear message in OpenAI's error shape."""

from __future__ import annotations

import httpx
import openai
import pytest


def post(server, path: str, **kw) -> httpx.Response:
    return httpx.post(server.url + path, timeout=60, **kw)


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) >= {"message", "type", "param", "code"}
    assert "Traceback" not in r.text
    return body["error"]


def test_malformed_json_is_400(server):
    e = error_of(post(server, "/v1/completions", content=b'{"prompt": "a",', headers={"content-type":
                                                                                    "application/json"}), 400)
    assert "not valid JSON" in e["message"]


@pytest.mark.parametrize("body, field", [
    ({"prompt": "a", "max_tokens": "many"}, "max_tokens"),
    ({"prompt": "a", "temperature": -1}, "temperature"),
    ({"prompt": {"text": "a"}}, "prompt"),
    ({"messages": "hello"}, "messages"),
])
def test_wrong_types_are_422(server, body, field):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    e = error_of(post(server, path, json={"model": "spm", **body}), 422)
    assert field in e["message"] and e["param"].startswith(field)


def test_unknown_model_is_404(server):
    with pytest.raises(openai.NotFoundError) as info:
        server.client().completions.create(model="gpt-4", prompt="a", max_tokens=2)
    assert "'gpt-4' does not exist" in str(info.value) and "spm" in str(info.value)
    e = error_of(post(server, "/extras/tokenize", json={"model": "nope", "input": "a"}), 404)
    assert e["code"] == "model_not_found"


def test_prompt_over_the_context_is_400(server):
    long = " ".join(["hello"] * 400)  # the slots hold 256 tokens each
    with pytest.raises(openai.BadRequestError) as info:
        server.client().completions.create(model="spm", prompt=long, max_tokens=2)
    assert "context" in str(info.value)
    e = error_of(post(server, "/v1/chat/completions",
                      json={"model": "spm", "messages": [{"role": "user", "content": long}]}), 400)
    assert e["code"] == "context_length_exceeded"


def test_limits_on_n_and_max_tokens(server):
    e = error_of(post(server, "/v1/completions", json={"model": "spm", "prompt": "a", "n": 5}), 400)
    assert e["param"] == "n" and "limit of 4" in e["message"]
    e = error_of(post(server, "/v1/completions", json={"model": "spm", "prompt": "a", "max_tokens": 201}), 400)
    assert e["param"] == "max_tokens" and "200" in e["message"]
    e = error_of(post(server, "/v1/chat/completions", json={"model": "spm", "max_tokens": 1000,
                                                            "messages": [{"role": "user", "content": "a"}]}), 400)
    assert e["param"] == "max_tokens"


def test_oversized_body_is_413(server):
    big = {"model": "spm", "prompt": "a" * (70 * 1024)}
    e = error_of(post(server, "/v1/completions", json=big), 413)
    assert "max_body_bytes" in e["message"]

    def chunks():  # no Content-Length: the limit counts what arrives
        for _ in range(80):
            yield b"x" * 1024

    e = error_of(post(server, "/v1/completions", content=chunks(), headers={"content-type": "application/json"}),
                 413)


def test_bad_values_found_by_the_model_are_400(server):
    e = error_of(post(server, "/v1/completions", json={"model": "spm", "prompt": [999999], "max_tokens": 2}), 400)
    assert "999999" in e["message"]
    e = error_of(post(server, "/v1/completions", json={"model": "spm", "prompt": "a", "grammar": "x ::= y"}), 400)
    assert "root" in e["message"]
    e = error_of(post(server, "/extras/detokenize", json={"model": "spm", "tokens": [-1]}), 400)
    assert "-1" in e["message"]
    e = error_of(post(server, "/v1/chat/completions", json={"model": "spm", "messages": [{"content": "a"}]}), 400)
    assert "role" in e["message"]
    e = error_of(post(server, "/v1/chat/completions", json={
        "model": "spm", "messages": [{"role": "user", "content": "a"}], "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "g"}}}), 400)
    assert "'g'" in e["message"]


def test_image_parts_need_a_projector(server):
    msg = [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                        {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]}]
    e = error_of(post(server, "/v1/chat/completions", json={"model": "spm", "messages": msg}), 400)
    assert "clip_model_path" in e["message"]


@pytest.fixture(scope="module")
def keyed(start_server, spm_path):
    return start_server([{"model": str(spm_path), "model_alias": "spm", "n_ctx": 128}], api_key="s3cret-key")


def test_api_key(keyed):
    assert keyed.client(api_key="s3cret-key").completions.create(model="spm", prompt="a", max_tokens=2).choices
    for key in ("wrong", "s3cret-ke", "s3cret-key-longer"):
        with pytest.raises(openai.AuthenticationError):
            keyed.client(api_key=key).models.list()
    e = error_of(httpx.get(keyed.url + "/v1/models"), 401)
    assert e["code"] == "invalid_api_key"
    e = error_of(httpx.post(keyed.url + "/extras/tokenize", json={"input": "a"},
                            headers={"Authorization": "Basic s3cret-key"}), 401)
    health = httpx.get(keyed.url + "/health")
    assert health.status_code == 200 and "models" not in health.json()  # liveness needs no key, models do
    assert "models" in httpx.get(keyed.url + "/health", headers={"Authorization": "Bearer s3cret-key"}).json()


def test_an_empty_api_key_is_refused():
    from llama_cpp.server.settings import ServerSettings

    with pytest.raises(ValueError, match="api_key"):
        ServerSettings(api_key="")


def test_limits_on_prompts_and_stop_strings(server):
    e = error_of(post(server, "/v1/completions", json={"model": "spm", "prompt": ["a"] * 17, "max_tokens": 1}), 400)
    assert e["param"] == "prompt" and "limit of 16" in e["message"]
    e = error_of(post(server, "/v1/completions", json={"model": "spm", "prompt": "a", "stop": ["x"] * 17}), 400)
    assert e["param"] == "stop" and "17 stop strings" in e["message"]
    e = error_of(post(server, "/v1/chat/completions", json={
        "model": "spm", "messages": [{"role": "user", "content": "a"}], "stop": "y" * 513}), 400)
    assert e["param"] == "stop" and "513 characters" in e["message"]


def test_a_request_that_can_never_fit_is_400_not_429(server):
    # 4 slots + a queue of 8: 4 prompts x n=4 = 16 generations can never run, even on an idle server
    e = error_of(post(server, "/v1/completions", json={"model": "spm", "prompt": ["a", "b", "c", "d"], "n": 4,
                                                       "max_tokens": 1}), 400)
    assert e["param"] == "n" and "at most 12" in e["message"]
    r = post(server, "/v1/completions", json={"model": "spm", "prompt": ["a", "b", "c"], "n": 4, "max_tokens": 1})
    assert r.status_code == 200 and len(r.json()["choices"]) == 12


def test_logprob_offsets_count_from_the_end_of_the_prompt(server):
    prompt = "hello there"
    r = post(server, "/v1/completions", json={"model": "spm", "prompt": prompt, "max_tokens": 5, "temperature": 0,
                                              "logprobs": 2}).json()["choices"][0]
    lp = r["logprobs"]
    assert "".join(lp["tokens"]) == r["text"]
    assert lp["text_offset"] == [len(prompt) + len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    e = error_of(post(server, "/v1/completions", json={"model": "spm", "prompt": prompt, "max_tokens": 2,
                                                       "echo": True, "logprobs": 1}), 400)
    assert e["param"] == "echo" and "n_parallel=0" in e["message"]

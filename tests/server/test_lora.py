"""LoRA per request, as llama-server serves it: several adapters per model, ``GET/POST /lora-adapters``,
a request's ``lora`` scales; slots with different adapter sets never share a decode step."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from llama_cpp import Llama

from .conftest import THREADS
from .together import run_together

N_EMBD, N_FF, N_LAYER = 64, 128, 2  # build_tools.fixtures.models' llama_spm
PROMPTS = ["hello there", "The capital of", "once upon a time in a land far away"]


def write_lora(path: Path, seed: int, rank: int = 4) -> Path:
    """A LoRA adapter GGUF for the tiny llama_spm model: random A and B on q, v, ffn_up and the head,
    large enough that greedy output changes with the scale."""
    from build_tools.fixtures._gguf import GGUFBuilder
    from build_tools.fixtures.vocab import spm_vocab

    n_vocab = len(spm_vocab())
    b = GGUFBuilder("llama", seed)
    b.string("general.type", "adapter")
    b.string("adapter.type", "lora")
    b.f32("adapter.lora.alpha", float(rank))
    # ggml's model tensor {n_in, n_out}: lora_a {n_in, rank} (NumPy (rank, n_in)), lora_b {rank, n_out}
    shapes = {f"blk.{il}.{n}.weight": (o, i) for il in range(N_LAYER)
              for n, o, i in (("attn_q", N_EMBD, N_EMBD), ("attn_v", N_EMBD // 2, N_EMBD), ("ffn_up", N_FF, N_EMBD))}
    shapes["output.weight"] = (n_vocab, N_EMBD)
    for name, (n_out, n_in) in shapes.items():
        b.normal(name + ".lora_a", (rank, n_in), 1.0 / np.sqrt(n_in))
        b.normal(name + ".lora_b", (n_out, rank), 1.5 / np.sqrt(rank))
    return b.write(path)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("lora")
    return [write_lora(d / "a.gguf", 1), write_lora(d / "b.gguf", 2)]


def solo(spm_path: Path, prompt: str, n: int, lora: Path | None = None, scale: float = 1.0) -> str:
    kw = {"lora_path": str(lora), "lora_scale": scale} if lora is not None else {}
    with Llama(spm_path, n_ctx=256, verbose=False, **THREADS, **kw) as llm:
        return llm.create_completion(prompt, max_tokens=n, temperature=0, repeat_penalty=1.1)["choices"][0]["text"]


@pytest.fixture(scope="module")
def served(start_server, spm_path, adapters):
    # lora_path (upstream's setting) is adapter 0; lora_adapters follow
    return start_server([{"model": str(spm_path), "model_alias": "spm", "n_parallel": 4, "n_ctx": 256, "n_batch": 64,
                          "lora_path": str(adapters[0]),
                          "lora_adapters": [{"path": str(adapters[1]), "scale": 0.0}]},
                         {"model": str(spm_path), "model_alias": "plain", "n_parallel": 2, "n_ctx": 256}])


def complete(srv, prompt: str, n: int, lora=None, model: str = "spm") -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0}
    if lora is not None:
        body["lora"] = lora
    return httpx.post(srv.url + "/v1/completions", json=body, timeout=120)


def text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_adapters_change_the_output(spm_path, adapters):
    base = solo(spm_path, PROMPTS[0], 16)
    assert solo(spm_path, PROMPTS[0], 16, adapters[0]) != base
    assert solo(spm_path, PROMPTS[0], 16, adapters[1]) != base


def test_request_scale_equals_llama_with_that_adapter(served, spm_path, adapters):
    for scale in (1.0, 0.5):
        want = solo(spm_path, PROMPTS[1], 16, adapters[1], scale)
        assert text(complete(served, PROMPTS[1], 16, [{"id": 1, "scale": scale}])) == want
    # the global scales (adapter 0 at 1, adapter 1 at 0) when the request names none
    assert text(complete(served, PROMPTS[1], 16)) == solo(spm_path, PROMPTS[1], 16, adapters[0], 1.0)


def test_scale_zero_is_the_base_model(served, spm_path):
    want = solo(spm_path, PROMPTS[2], 16)
    assert text(complete(served, PROMPTS[2], 16, [{"id": 0, "scale": 0.0}])) == want
    assert text(complete(served, PROMPTS[2], 16, [])) == want  # an empty list: every adapter at 0


def test_chat_takes_lora_too(served, spm_path, adapters):
    msgs = [{"role": "user", "content": "hi"}]
    with Llama(spm_path, n_ctx=256, verbose=False, lora_path=str(adapters[1]), **THREADS) as llm:
        want = llm.create_chat_completion(msgs, max_tokens=12, temperature=0, repeat_penalty=1.1)
    r = httpx.post(served.url + "/v1/chat/completions", timeout=120,
                   json={"model": "spm", "messages": msgs, "max_tokens": 12, "temperature": 0,
                         "lora": [{"id": 1, "scale": 1.0}]})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]


def test_concurrent_requests_with_different_adapters(served, spm_path, adapters):
    cases = [(PROMPTS[0], [{"id": 0, "scale": 1.0}], adapters[0], 1.0),
             (PROMPTS[0], [{"id": 1, "scale": 1.0}], adapters[1], 1.0),
             (PROMPTS[1], [], None, 1.0),
             (PROMPTS[2], [{"id": 1, "scale": 0.7}], adapters[1], 0.7)]
    n = 24
    want = [solo(spm_path, p, n, path, scale) for p, _, path, scale in cases]
    steps0 = served.engine("spm").steps
    got = dict(enumerate(run_together(lambda case: text(complete(served, case[0], n, case[1])), cases,
                                      timeout=120)))
    assert [got[i] for i in range(len(cases))] == want
    assert served.engine("spm").steps - steps0 > 0


def test_lora_adapters_get_and_post_round_trip(served, spm_path, adapters):
    url = served.url + "/lora-adapters"
    got = httpx.get(url).json()
    assert [(a["id"], a["path"], a["scale"]) for a in got] == [(0, str(adapters[0]), 1.0), (1, str(adapters[1]), 0.0)]
    try:
        r = httpx.post(url, json=[{"id": 1, "scale": 0.5}])
        assert r.status_code == 200 and r.json() == {"success": True}
        assert [a["scale"] for a in httpx.get(url).json()] == [0.0, 0.5]  # an adapter not named goes to 0
        # requests without a lora field now use these scales
        assert text(complete(served, PROMPTS[1], 16)) == solo(spm_path, PROMPTS[1], 16, adapters[1], 0.5)
    finally:
        httpx.post(url, json=[{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}])
    assert [a["scale"] for a in httpx.get(url).json()] == [1.0, 0.0]
    assert httpx.get(url, params={"model": "plain"}).json() == []


@pytest.mark.parametrize("lora, needle", [
    ([{"id": 7, "scale": 1.0}], "not an adapter"),
    ([{"id": 0, "scale": "big"}], "not a finite number"),
    ([{"id": "0", "scale": 1.0}], "not an adapter"),
    ({"id": 0}, "must be a list"),
    ([3], "must be an object"),
])
def test_bad_lora_is_400(served, lora, needle):
    r = complete(served, "hi", 4, lora)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["param"] == "lora"
    r = httpx.post(served.url + "/lora-adapters", json=lora if isinstance(lora, list) else {"x": 1})
    assert r.status_code == 400, r.text


def test_lora_on_a_model_without_adapters_is_400(served):
    r = complete(served, "hi", 4, [{"id": 0, "scale": 1.0}], model="plain")
    assert r.status_code == 400 and "no LoRA adapters" in r.json()["error"]["message"]
    r = httpx.post(served.url + "/lora-adapters", params={"model": "plain"}, json=[{"id": 0, "scale": 1.0}])
    assert r.status_code == 400 and "no LoRA adapters" in r.json()["error"]["message"]


def test_serial_engine_switches_adapters(start_server, spm_path, adapters):
    srv = start_server([{"model": str(spm_path), "model_alias": "spm", "n_parallel": 0, "n_ctx": 256,
                         "lora_adapters": [{"path": str(adapters[0])}, {"path": str(adapters[1])}],
                         "lora_init_without_apply": True}])
    assert [a["scale"] for a in httpx.get(srv.url + "/lora-adapters").json()] == [0.0, 0.0]
    assert text(complete(srv, PROMPTS[0], 12)) == solo(spm_path, PROMPTS[0], 12)
    assert text(complete(srv, PROMPTS[0], 12, [{"id": 1, "scale": 1.0}])) == solo(spm_path, PROMPTS[0], 12,
                                                                                   adapters[1])
    assert text(complete(srv, PROMPTS[0], 12)) == solo(spm_path, PROMPTS[0], 12)


def test_cli_parses_lora_flags():
    import argparse

    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.settings import ModelSettings

    p = argparse.ArgumentParser()
    add_args_from_model(p, ModelSettings)
    args = p.parse_args(["--model", "m.gguf", "--lora_adapters", "a.gguf", "b.gguf:0.25",
                         '{"path": "c:d.gguf", "scale": 2}'])
    s = parse_model_from_args(ModelSettings, args)
    assert [(a.path, a.scale) for a in s.lora_adapters] == [("a.gguf", 1.0), ("b.gguf", 0.25), ("c:d.gguf", 2.0)]


def test_responses_and_messages_pass_lora_through(served):
    bad = [{"id": 9, "scale": 1.0}]
    r = httpx.post(served.url + "/v1/responses", timeout=120,
                   json={"model": "spm", "input": "hi", "max_output_tokens": 4, "lora": bad})
    assert r.status_code == 400 and "not an adapter" in r.text
    r = httpx.post(served.url + "/v1/messages", timeout=120,
                   json={"model": "spm", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                         "lora": bad})
    assert r.status_code == 400 and "not an adapter" in r.text
    ok = {"model": "spm", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
          "lora": [{"id": 1, "scale": 1.0}]}
    assert httpx.post(served.url + "/v1/messages", timeout=120, json=ok).status_code == 200


def test_speculating_slots_keep_each_adapter_set_apart(start_server, spm_path, adapters):
    srv = start_server([{"model": str(spm_path), "model_alias": "spm", "n_parallel": 3, "n_ctx": 256,
                         "spec_type": "ngram-simple", "lora_adapters": [{"path": str(p)} for p in adapters],
                         "lora_init_without_apply": True}])
    cases = [([{"id": 0, "scale": 1.0}], adapters[0]), ([{"id": 1, "scale": 1.0}], adapters[1]), ([], None)]
    n = 32
    want = [solo(spm_path, PROMPTS[2], n, path) for _, path in cases]
    got = dict(enumerate(run_together(lambda case: text(complete(srv, PROMPTS[2], n, case[0])), cases, timeout=120)))
    assert [got.get(i) for i in range(len(cases))] == want


def test_the_prompt_cache_keeps_each_adapter_set_apart(start_server, spm_path, adapters):
    """One slot, the shared prompt cache on: a state goes to the cache under the scales it was made with,
    a request under other scales never reuses it, and a later request under the same scales does."""
    srv = start_server([{"model": str(spm_path), "model_alias": "spm", "n_parallel": 1, "n_ctx": 256,
                         "lora_adapters": [{"path": str(adapters[0]), "scale": 0.0},
                                           {"path": str(adapters[1]), "scale": 0.0}]}])
    pc = srv.engine("spm").prompt_cache
    assert pc is not None
    prompt = PROMPTS[0] * 3
    a, b = [{"id": 0, "scale": 1.0}], [{"id": 1, "scale": 1.0}]
    first = complete(srv, prompt, 8, a)
    assert text(first) == solo(spm_path, prompt, 8, adapters[0])
    second = complete(srv, prompt, 8, b)  # the same prompt under other scales: nothing reused
    assert text(second) == solo(spm_path, prompt, 8, adapters[1])
    assert second.json()["usage"].get("prompt_tokens_cached", 0) == 0
    assert [e.key for e in pc.entries] == [(1.0, 0.0)]  # the first request's state, kept under its scales
    longer = prompt + " and more"
    third = complete(srv, longer, 8, a)  # back to a: its state comes back from the cache
    assert text(third) == solo(spm_path, longer, 8, adapters[0])
    assert third.json()["usage"]["prompt_tokens_cached"] > 0 and pc.restored >= 1
    restored = pc.restored
    fourth = complete(srv, longer, 8, [{"id": 0, "scale": 0.5}])  # other scales of the same adapter: a miss
    assert fourth.json()["usage"].get("prompt_tokens_cached", 0) == 0 and pc.restored == restored
    assert text(fourth) == solo(spm_path, longer, 8, adapters[0], 0.5)

"""The slot engine: concurrent greedy streams equal solo runs, disconnects free slots, a full queue is 429."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from llama_cpp import Llama

from .conftest import THREADS

PROMPTS = ["hello there", "The capital of", "a", "once upon a time in a land far away there lived",
           "b c d", "small", "What is the name of the", "x y"]


def assert_kv_matches_bookkeeping(engine) -> None:
    """Each free sequence holds exactly the tokens the engine thinks it caches."""
    for seq in range(engine.n_slots):
        assert engine.ctx.seq_pos_max(seq) + 1 == len(engine.cached[seq]), seq


def wait_for(cond, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture(scope="module")
def parallel(start_server, spm_path):
    return start_server([{"model": str(spm_path), "model_alias": "spm", "n_parallel": 8, "n_ctx": 256,
                          "n_batch": 64, "max_queue": 4}])


def test_eight_concurrent_streams_equal_solo_runs(parallel, spm_path):
    lengths = [40, 33, 48, 25, 37, 44, 30, 41]
    with Llama(spm_path, n_ctx=256, verbose=False, **THREADS) as solo:
        expected = [solo.create_completion(p, max_tokens=n, temperature=0, repeat_penalty=1.1)["choices"][0]["text"]
                    for p, n in zip(PROMPTS, lengths)]
    engine = parallel.engine("spm")
    steps0, toks0 = engine.steps, engine.tokens_generated
    results: dict[int, str] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(PROMPTS))

    def client(i: int) -> None:
        try:
            c = parallel.client()
            barrier.wait()
            stream = c.completions.create(model="spm", prompt=PROMPTS[i], max_tokens=lengths[i], temperature=0,
                                          stream=True)
            results[i] = "".join(ch.choices[0].text for ch in stream)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for i, want in enumerate(expected):
        assert results[i] == want, (i, PROMPTS[i])
    # the tokens were decoded in shared batches: fewer decode steps than generated tokens
    assert engine.tokens_generated - toks0 == sum(lengths)
    assert engine.steps - steps0 < sum(lengths)


def test_mixed_sampling_in_one_batch(parallel, spm_path):
    """Greedy requests next to sampled and grammar-constrained ones keep their own chains."""
    with Llama(spm_path, n_ctx=256, verbose=False, **THREADS) as solo:
        want = solo.create_completion("hello there", max_tokens=30, temperature=0, repeat_penalty=1.1)
        seeded = solo.create_completion("a", max_tokens=30, temperature=0.9, seed=7, repeat_penalty=1.1)
    out: dict[str, str] = {}

    def run(key: str, **kw) -> None:
        out[key] = parallel.client().completions.create(model="spm", max_tokens=30, **kw).choices[0].text

    jobs = [threading.Thread(target=run, args=("greedy",), kwargs={"prompt": "hello there", "temperature": 0}),
            threading.Thread(target=run, args=("seeded",), kwargs={"prompt": "a", "temperature": 0.9, "seed": 7}),
            threading.Thread(target=run, args=("digits",), kwargs={"prompt": "b", "temperature": 0.5,
                                                                   "extra_body": {"grammar": 'root ::= [0-9]+'}})]
    for t in jobs:
        t.start()
    for t in jobs:
        t.join(60)
    assert out["greedy"] == want["choices"][0]["text"]
    assert out["seeded"] == seeded["choices"][0]["text"]
    assert out["digits"].isdigit()


def test_disconnect_frees_the_slot(start_server, spm_path):
    srv = start_server([{"model": str(spm_path), "model_alias": "m", "n_parallel": 2, "n_ctx": 30000}],
                       max_tokens_limit=29000)
    engine = srv.engine("m")
    before = engine.tokens_generated
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", srv.url + "/v1/completions",
                         json={"model": "m", "prompt": "a", "max_tokens": 29000, "temperature": 0,
                               "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
        # the response is closed mid-stream: its slot is freed (sequence removed) at once
    assert wait_for(lambda: engine.stats()["active"] == 0)
    assert engine.tokens_generated - before < 29000  # it stopped instead of generating to the end
    assert engine.cached == [[], []]  # a cancelled request leaves nothing in the KV cache
    assert_kv_matches_bookkeeping(engine)
    r = srv.client().completions.create(model="m", prompt="a", max_tokens=20, temperature=0)
    assert r.usage.completion_tokens == 20


def test_full_queue_answers_429_at_once(start_server, spm_path):
    srv = start_server([{"model": str(spm_path), "model_alias": "one", "n_parallel": 1, "n_ctx": 4096,
                         "max_queue": 1}], max_tokens_limit=4000)
    engine = srv.engine("one")
    body = {"model": "one", "prompt": "a", "max_tokens": 4000, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as h1, httpx.Client(timeout=60) as h2, httpx.Client(timeout=60) as h3:
        with h1.stream("POST", srv.url + "/v1/completions", json=body) as r1:
            assert r1.status_code == 200
            req2 = threading.Thread(target=lambda: h2.post(srv.url + "/v1/completions", json=body))
            req2.start()
            assert wait_for(lambda: engine.stats()["waiting"] == 1)
            r3 = h3.post(srv.url + "/v1/completions", json=body)
            assert r3.status_code == 429
            assert r3.headers["retry-after"] == "1"
            err = r3.json()["error"]
            assert err["code"] == "queue_full" and "retry" in err["message"]
        engine.wake()
        # r1 closed: its slot goes to the queued request, which then runs to its end
        req2.join(120)
    assert wait_for(lambda: engine.busy == 0, 120)


def test_non_streaming_client_that_leaves_frees_its_slot(start_server, spm_path):
    srv = start_server([{"model": str(spm_path), "model_alias": "m", "n_parallel": 2, "n_ctx": 30000}],
                       max_tokens_limit=29000)
    engine = srv.engine("m")
    before = engine.tokens_generated
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(srv.url + "/v1/completions", timeout=httpx.Timeout(60, read=0.5),
                   json={"model": "m", "prompt": "a", "max_tokens": 29000, "temperature": 0})
    assert wait_for(lambda: engine.stats()["active"] == 0)
    assert engine.tokens_generated - before < 29000  # it stopped instead of generating to the end
    assert engine.ctx.seq_pos_max(0) == -1 and engine.ctx.seq_pos_max(1) == -1


def test_a_cached_prefix_is_reused_with_the_same_output(parallel, spm_path):
    engine = parallel.engine("spm")
    first = "a story about a cat and a dog who lived in a small house by the"
    c = parallel.client()
    a = c.completions.create(model="spm", prompt=first, max_tokens=10, temperature=0)
    follow = first + a.choices[0].text + " and then"
    b = c.completions.create(model="spm", prompt=follow, max_tokens=10, temperature=0)
    with Llama(spm_path, n_ctx=256, verbose=False, **THREADS) as solo:
        want = solo.create_completion(follow, max_tokens=10, temperature=0, repeat_penalty=1.1)
        n_first = len(solo.tokenize(first.encode()))
    assert b.choices[0].text == want["choices"][0]["text"]
    assert b.model_dump()["usage"]["prompt_tokens_cached"] >= n_first
    assert_kv_matches_bookkeeping(engine)


def test_one_requests_failure_does_not_end_the_others(parallel, spm_path, monkeypatch):
    """A sampler, grammar or hook that fails in one slot ends that request only."""
    with Llama(spm_path, n_ctx=256, verbose=False, **THREADS) as solo:
        want = solo.create_completion("hello there", max_tokens=40, temperature=0,
                                      repeat_penalty=1.1)["choices"][0]["text"]
        boom_tokens = solo.tokenize(b"once upon a time")
    engine = parallel.engine("spm")
    real = engine._accept

    def flaky(s, tok, row):
        if s.req.prompt_tokens == boom_tokens and s.produced >= 2:
            raise RuntimeError("injected sampler failure")
        return real(s, tok, row)

    monkeypatch.setattr(engine, "_accept", flaky)
    out: dict[str, object] = {}

    def run(key: str, prompt: str) -> None:
        try:
            stream = parallel.client().completions.create(model="spm", prompt=prompt, max_tokens=40,
                                                          temperature=0, stream=True)
            out[key] = "".join(ch.choices[0].text for ch in stream)
        except Exception as exc:  # noqa: BLE001 - the failing one is expected to raise
            out[key] = exc

    jobs = [threading.Thread(target=run, args=("ok", "hello there")),
            threading.Thread(target=run, args=("boom", "once upon a time"))]
    for t in jobs:
        t.start()
    for t in jobs:
        t.join(60)
    assert out["ok"] == want
    assert isinstance(out["boom"], Exception), out["boom"]
    assert wait_for(lambda: not engine._active)
    assert_kv_matches_bookkeeping(engine)


def _stream_while_another_waits(srv, engine, max_tokens: int) -> tuple[list[dict], int]:
    """A stream of ``max_tokens`` that a second request queues behind; (its chunks, the second's status)."""
    import json

    body = {"model": "one", "prompt": "a", "max_tokens": max_tokens, "temperature": 0, "stream": True}
    chunks: list[dict] = []
    status: list[int] = []
    with httpx.Client(timeout=120) as h1, httpx.Client(timeout=120) as h2:
        with h1.stream("POST", srv.url + "/v1/completions", json=body) as r1:
            assert r1.status_code == 200
            lines = r1.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    chunks.append(json.loads(line[6:]))
                    break
            second = threading.Thread(target=lambda: status.append(h2.post(
                srv.url + "/v1/completions", json={**body, "max_tokens": 4, "stream": False}).status_code))
            second.start()
            assert wait_for(lambda: engine.stats()["waiting"] == 1 or status)
            for line in lines:
                if line == "data: [DONE]":
                    break
                if line.startswith("data: "):
                    chunks.append(json.loads(line[6:]))
        second.join(120)
    return chunks, status[0]


@pytest.mark.parametrize("interrupt", [True, False])
def test_interrupt_requests_ends_a_serial_stream_when_another_waits(start_server, spm_path, interrupt):
    srv = start_server([{"model": str(spm_path), "model_alias": "one", "n_parallel": 0, "n_ctx": 4096,
                         "max_queue": 2}], max_tokens_limit=4000, interrupt_requests=interrupt)
    engine = srv.engine("one")
    chunks, status = _stream_while_another_waits(srv, engine, 3000 if interrupt else 200)
    assert status == 200  # the waiting request is served either way
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]]
    if interrupt:
        assert reasons == [] and len(chunks) < 3000  # cut short, as upstream: no finish_reason
    else:
        assert reasons in (["length"], ["stop"])  # ran to its own end
    assert wait_for(lambda: engine.busy == 0, 120)

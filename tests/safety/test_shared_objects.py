"""Issue 13 item 1: one Llama / LlamaEmbedding shared between threads. Calls are serialized (same
results as sequential runs), an open stream makes other calls fail at once with BusyError, and
close() from another thread never frees memory in use (many trials, in a subprocess)."""

from __future__ import annotations

import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import Llama, LlamaEmbedding
from llama_cpp._errors import BusyError
from tests.safety.probe import run_python

PROMPTS = ["hello there", "once upon a time", "the quick brown fox", "in a galaxy far away"]


@pytest.fixture(scope="module")
def llm() -> Llama:
    with Llama(fixture_path("llama_spm"), n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False) as m:
        yield m


def complete(llm: Llama, i: int) -> str:
    seeded = i % 2  # greedy and seeded sampling both
    return llm(PROMPTS[i % 4], max_tokens=12, temperature=0.9 if seeded else 0, seed=i)["choices"][0]["text"]


def test_four_threads_give_the_sequential_texts(llm: Llama) -> None:
    jobs = list(range(32))
    expected = [complete(llm, i) for i in jobs]
    for _ in range(3):
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(lambda i: complete(llm, i), jobs)) == expected


def test_streams_of_four_threads_are_refused_or_whole(llm: Llama) -> None:
    expected = complete(llm, 0)
    outcomes: list[str] = []
    start = threading.Barrier(4)

    def stream_once() -> None:
        start.wait()
        for _ in range(20):
            try:
                chunks = llm(PROMPTS[0], max_tokens=12, temperature=0, seed=0, stream=True)
                outcomes.append("".join(c["choices"][0]["text"] for c in chunks))
            except BusyError:
                outcomes.append("busy")

    threads = [threading.Thread(target=stream_once) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(outcomes) == 80
    assert set(outcomes) <= {expected, "busy"} and expected in outcomes


def test_second_stream_fails_at_once_and_first_continues(llm: Llama) -> None:
    expected = complete(llm, 0)
    first = llm(PROMPTS[0], max_tokens=12, temperature=0, stream=True)
    head = next(first)["choices"][0]["text"]
    with pytest.raises(BusyError, match="stream of this Llama is open"):
        llm(PROMPTS[1], max_tokens=4, stream=True)
    with pytest.raises(BusyError):
        llm(PROMPTS[1], max_tokens=4)
    with pytest.raises(BusyError):
        llm.generate(llm.tokenize(b"hi"))
    assert llm.tokenize(b"hi")  # read-only calls stay open
    assert head + "".join(c["choices"][0]["text"] for c in first) == expected
    assert complete(llm, 0) == expected  # exhausted: the object is free again


def test_abandoned_stream_frees_the_object(llm: Llama) -> None:
    for _ in llm(PROMPTS[0], max_tokens=12, stream=True):
        break
    stream = llm.generate(llm.tokenize(b"hi"), temp=0)
    next(stream)
    stream.close()
    assert complete(llm, 1)


def test_embedding_shared_between_threads() -> None:
    with LlamaEmbedding(fixture_path("embedding_model"), n_threads=1) as emb:
        texts = [f"text number {i}" for i in range(16)]
        expected = [emb.embed(t) for t in texts]
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(emb.embed, texts * 2))
        for a, b in zip(got, expected * 2, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


CLOSE_RACE = textwrap.dedent('''
    import json, random, sys, threading, time
    from llama_cpp import Llama
    from llama_cpp._errors import ClosedError
    path, trials = sys.argv[1], int(sys.argv[2])
    seen = {}
    random.seed(0)
    for trial in range(trials):
        llm = Llama(path, n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False)
        stream = trial % 2 == 1
        result = []

        def work():
            try:
                if stream:
                    for c in llm("once upon a time", max_tokens=400, temperature=0, stream=True):
                        result.append(c)
                    result.append("done")
                else:
                    llm("once upon a time", max_tokens=400, temperature=0)
                    result.append("done")
            except ClosedError:
                result.append("closed")

        t = threading.Thread(target=work)
        t.start()
        time.sleep(random.uniform(0.0, 0.02))
        llm.close()
        t.join(60)
        outcome = result[-1] if result else "nothing"
        seen[outcome] = seen.get(outcome, 0) + 1
    print(json.dumps(seen))
''')


def test_close_during_completion_never_crashes() -> None:
    seen = run_python(CLOSE_RACE, str(fixture_path("llama_spm")), "24", timeout=120)
    assert sum(seen.values()) == 24 and set(seen) <= {"done", "closed"}, seen

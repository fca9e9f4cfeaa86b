"""Prompt caches (``LlamaRAMCache``, ``LlamaDiskCache``, ``set_cache``) and ``save_state``/``load_state``:
a hit gives the same output as a fresh run, on a transformer and on a hybrid (recurrent-memory) model."""

from __future__ import annotations

import os

import numpy as np
import pytest

import llama_cpp
from llama_cpp import Llama, LlamaDiskCache, LlamaRAMCache, LlamaState
from llama_cpp._errors import CacheError
from llama_cpp._safety.state_integrity import model_fingerprint

PROMPT = "The quick brown fox jumps over"


def make(path):
    return Llama(path, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=1, verbose=False)


@pytest.fixture(params=["spm_model", "hybrid_model", "recurrent_model"])
def model_path(request):
    return request.getfixturevalue(request.param)


def counting_load_state(llm):
    calls = []
    original = llm.load_state

    def tracker(state):
        calls.append(state)
        original(state)

    llm.load_state = tracker
    return calls


def test_ram_cache_hit_matches_fresh(model_path):
    with make(model_path) as fresh:
        expected = fresh(PROMPT, max_tokens=6, temperature=0)
    cache = LlamaRAMCache()
    with make(model_path) as writer:
        writer.set_cache(cache)
        writer(PROMPT, max_tokens=6, temperature=0)
    assert len(cache) == 1
    with make(model_path) as cached:
        cached.set_cache(cache)
        calls = counting_load_state(cached)
        actual = cached(PROMPT, max_tokens=6, temperature=0)
        assert len(calls) == 1
        assert actual["choices"][0]["text"] == expected["choices"][0]["text"]
        assert actual["usage"] == expected["usage"]
        # a longer prompt sharing the cached prefix also restores it, then evaluates only the rest
        longer = cached(PROMPT + " the lazy", max_tokens=4, temperature=0)
    with make(model_path) as fresh:
        assert longer["choices"][0]["text"] == fresh(PROMPT + " the lazy", max_tokens=4, temperature=0)["choices"][0]["text"]


def test_disk_cache_hit_matches_fresh(model_path, tmp_path):
    with make(model_path) as fresh:
        expected = fresh(PROMPT, max_tokens=5, temperature=0)["choices"][0]["text"]
    with make(model_path) as writer:
        writer.set_cache(LlamaDiskCache(tmp_path / "cache"))
        writer(PROMPT, max_tokens=5, temperature=0)
    files = os.listdir(tmp_path / "cache")
    assert len(files) == 1 and files[0].endswith(".llamastate.npz")  # no temporary file left behind
    with make(model_path) as cached:
        cached.set_cache(LlamaDiskCache(tmp_path / "cache"))  # a new object over the same directory
        calls = counting_load_state(cached)
        assert cached(PROMPT, max_tokens=5, temperature=0)["choices"][0]["text"] == expected
        assert len(calls) == 1


def test_no_restore_when_the_context_already_holds_more(spm_model):
    cache = LlamaRAMCache()
    with make(spm_model) as m:
        m.set_cache(cache)
        m(PROMPT, max_tokens=3, temperature=0)
        calls = counting_load_state(m)
        m(PROMPT, max_tokens=3, temperature=0)
        assert calls == []  # the context shares as much with the prompt as the cached state


def test_lookup_is_by_longest_prefix():
    cache = LlamaRAMCache()

    def state(n):
        return LlamaState(np.arange(n, dtype=np.intc), None, n, b"x" * n, n, 0)

    cache[[1, 2, 3]] = state(3)
    cache[[1, 2, 9, 9]] = state(4)
    assert cache[[1, 2, 3, 4]].n_tokens == 3
    assert cache[[1, 2, 9]].n_tokens == 4
    assert [1, 5] in cache and [7] not in cache
    with pytest.raises(KeyError):
        cache[[7, 8]]


def test_ram_cache_capacity_evicts_least_recently_used():
    cache = LlamaRAMCache(capacity_bytes=10)

    def state(size):
        return LlamaState(np.zeros(1, np.intc), None, 1, b"x" * size, size, 0)

    cache[[1]] = state(4)
    cache[[2]] = state(4)
    _ = cache[[1]]  # used: now the newest
    cache[[3]] = state(4)
    assert [1] in cache and [3] in cache and [2] not in cache
    assert cache.cache_size == 8


def test_disk_cache_capacity_and_round_trip(tmp_path):
    cache = LlamaDiskCache(tmp_path, capacity_bytes=1)
    s = LlamaState(np.array([5, 6, 7], np.intc), np.ones((1, 4), np.single), 3, b"\x00\x01\x02", 3, 42)
    cache[[5, 6, 7]] = s
    got = cache[[5, 6, 7, 8]]
    assert got.input_ids.tolist() == [5, 6, 7] and got.seed == 42 and got.llama_state == b"\x00\x01\x02"
    assert np.array_equal(got.scores, s.scores)
    cache[[9]] = LlamaState(np.array([9], np.intc), None, 1, b"zz", 2, 0)
    assert len(cache) == 1 and [9] in cache and got.scores is not None  # over capacity: the older entry went


def test_disk_cache_unwritable_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CacheError, match="cannot write") as info:
        LlamaDiskCache(blocker / "cache")
    assert isinstance(info.value, OSError)


def test_disk_cache_failed_write_leaves_nothing(tmp_path, monkeypatch):
    cache = LlamaDiskCache(tmp_path)

    def broken(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(CacheError, match="could not write"):
        cache[[1, 2]] = LlamaState(np.array([1, 2], np.intc), None, 2, b"ab", 2, 0)
    assert os.listdir(tmp_path) == []


def test_disk_cache_ignores_junk_files(tmp_path):
    (tmp_path / "junk.llamastate.npz").write_bytes(b"not an archive")
    cache = LlamaDiskCache(tmp_path)
    with pytest.raises(KeyError):
        cache[[1]]


def test_set_cache_type_checked(spm_model):
    with make(spm_model) as m:
        with pytest.raises(TypeError, match="BaseLlamaCache"):
            m.set_cache({})
        m.set_cache(llama_cpp.LlamaCache())
        m.set_cache(None)
        assert m.cache is None


def test_save_load_state_matches_fresh(model_path):
    with make(model_path) as fresh:
        toks = fresh.tokenize(PROMPT.encode())
        expected = fresh.create_completion(toks, max_tokens=5, temperature=0)["choices"][0]["text"]
    with make(model_path) as src:
        src.eval(toks)
        state = src.save_state()
    assert state.n_tokens == len(toks) and state.scores.shape == (1, src._n_vocab)
    with make(model_path) as dst:
        dst.eval(dst.tokenize(b"something else entirely"))
        dst.load_state(state)
        assert dst.n_tokens == len(toks) and dst.input_ids.tolist() == toks
        assert dst.create_completion(toks, max_tokens=5, temperature=0)["choices"][0]["text"] == expected


def test_a_state_of_another_model_is_refused_and_leaves_no_stale_history(spm_model, hybrid_model, tmp_path):
    with make(spm_model) as a:
        a(PROMPT, max_tokens=3, temperature=0)
        state = a.save_state()
    assert state.fingerprint
    with make(hybrid_model) as b:
        expected = b(PROMPT, max_tokens=4, temperature=0)["choices"][0]["text"]
        with pytest.raises(llama_cpp.LlamaError, match="another model"):
            b.load_state(state)
        assert b(PROMPT, max_tokens=4, temperature=0)["choices"][0]["text"] == expected
        # its seal records the model too: refused before llama.cpp, memory and history kept together
        state.fingerprint = None
        with pytest.raises(llama_cpp.LlamaError, match="other settings"):
            b.load_state(state)
        assert b.n_tokens == 9
        # unsealed (made by hand), llama.cpp itself refuses the bytes: memory and history are cleared together
        state.made_from = state.digest = None
        with pytest.raises(llama_cpp.LlamaError):
            b.load_state(state)
        assert b.n_tokens == 0
        assert b(PROMPT, max_tokens=4, temperature=0)["choices"][0]["text"] == expected


def test_a_shared_disk_cache_never_serves_another_models_state(spm_model, tmp_path):
    import shutil

    twin = tmp_path / "twin.gguf"
    shutil.copyfile(spm_model, twin)  # same shapes and tokens: llama.cpp would accept its state
    with make(spm_model) as writer:
        writer.set_cache(LlamaDiskCache(tmp_path / "cache"))
        writer(PROMPT, max_tokens=3, temperature=0)
    with make(twin) as reader:
        reader.set_cache(LlamaDiskCache(tmp_path / "cache"))
        calls = counting_load_state(reader)
        with make(twin) as fresh:
            expected = fresh(PROMPT, max_tokens=3, temperature=0)["choices"][0]["text"]
        assert reader(PROMPT, max_tokens=3, temperature=0)["choices"][0]["text"] == expected
        assert len(calls) == 1 and calls[0].fingerprint != model_fingerprint(reader)  # offered, refused

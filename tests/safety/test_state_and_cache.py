"""Issue 29: states and prompt-cache entries that would hang, inflate or silently steer the output."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from build_tools.fixtures.cache import fixture_path
from llama_cpp import Llama, LlamaDiskCache, LlamaState
from llama_cpp._errors import LlamaError

PROMPT = "The quick brown fox jumps over"
OTHER = "Once upon a time there was a"


def make(n_ctx: int = 64) -> Llama:
    return Llama(str(fixture_path("llama_spm")), n_ctx=n_ctx, n_batch=64, n_ubatch=64, n_threads=1, verbose=False)


def greedy(llm: Llama, prompt: str) -> str:
    return llm(prompt, max_tokens=4, temperature=0)["choices"][0]["text"]


def _entry(cache: LlamaDiskCache) -> Path:
    (entry,) = [p for p in cache.cache_dir.iterdir() if p.name.endswith(LlamaDiskCache.SUFFIX)]
    return entry


def _rewrite_entry(path: Path, **changes: np.ndarray) -> None:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays.update(changes)
    np.savez(path, **arrays)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_fifo_named_like_an_entry_does_not_block(tmp_path: Path) -> None:
    cache = LlamaDiskCache(tmp_path / "c")
    with make() as llm:
        llm.set_cache(cache)
        greedy(llm, PROMPT)
        os.mkfifo(cache.cache_dir / ("f" * 32 + LlamaDiskCache.SUFFIX))
        done: list[str] = []
        worker = threading.Thread(target=lambda: done.append(greedy(llm, PROMPT + " the")), daemon=True)
        worker.start()
        worker.join(30)
        assert done, "a completion blocked on a FIFO in the cache folder"


def test_zip_bomb_entry_is_refused_not_inflated(tmp_path: Path) -> None:
    cache = LlamaDiskCache(tmp_path / "c")
    bomb = cache.cache_dir / ("b" * 32 + LlamaDiskCache.SUFFIX)
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("key.npy", b"\x93NUMPY" + b"\0" * (200 << 20))  # 200 MB of zeros, a few hundred KB on disk
    start = time.monotonic()
    for _ in range(5):
        with pytest.raises(KeyError):
            cache[[1, 2, 3]]
    assert time.monotonic() - start < 1.0


def test_load_state_refuses_an_empty_state() -> None:
    with make() as llm:
        expected = greedy(llm, PROMPT)
        empty = LlamaState(np.array([], np.intc), None, 0, b"", 0, 0)
        with pytest.raises(LlamaError, match="no memory bytes"):
            llm.load_state(empty)
        assert greedy(llm, PROMPT) == expected


def test_state_whose_tokens_were_changed_is_refused() -> None:
    with make() as llm:
        greedy(llm, PROMPT)
        state = llm.save_state()
        forged = dataclasses.replace(state, input_ids=np.asarray(llm.tokenize(OTHER.encode()) * 4, np.intc)[
            : len(state.input_ids)])
        with pytest.raises(LlamaError, match="digest"):
            llm.load_state(forged)


def test_unsealed_state_whose_token_count_differs_from_its_memory_is_refused() -> None:
    with make() as llm:
        greedy(llm, PROMPT)
        state = llm.save_state()
        short = dataclasses.replace(state, n_tokens=state.n_tokens - 2, made_from=None, digest=None)
        with pytest.raises(LlamaError, match="memory holds positions"):
            llm.load_state(short)
        assert llm.n_tokens == 0
        with make() as fresh:
            assert greedy(llm, OTHER) == greedy(fresh, OTHER)


def test_state_of_another_context_size_is_refused() -> None:
    with make(256) as a:
        greedy(a, PROMPT)
        state = a.save_state()
    with make(512) as b, pytest.raises(LlamaError, match="n_ctx=256"):
        b.load_state(state)


def _written_cache(folder: Path) -> tuple[LlamaDiskCache, Path]:
    """A disk cache holding one entry written by a completion, and that entry's file."""
    with make() as writer:
        writer.set_cache(LlamaDiskCache(folder))
        greedy(writer, PROMPT)
    cache = LlamaDiskCache(folder)
    return cache, _entry(cache)


def test_tampered_disk_cache_entry_does_not_steer_the_output(tmp_path: Path) -> None:
    cache, entry = _written_cache(tmp_path / "c")
    with np.load(entry, allow_pickle=False) as z:
        ids = z["input_ids"].copy()
        key = z["key"].tolist()
    ids[1:] = ids[1]  # the same count, other tokens: llama.cpp would accept the memory
    _rewrite_entry(entry, input_ids=ids)
    with pytest.raises(KeyError, match="digest"):
        cache[key]
    with make() as reader, make() as fresh:
        reader.set_cache(cache)
        assert greedy(reader, PROMPT) == greedy(fresh, PROMPT)


def test_entry_without_digest_is_refused(tmp_path: Path) -> None:
    cache, entry = _written_cache(tmp_path / "c")
    with np.load(entry, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k not in ("digest", "made_from")}
        key = z["key"].tolist()
    np.savez(entry, **arrays)
    with pytest.raises(KeyError, match="no digest"):
        cache[key]
